#!/usr/bin/python
# Copyright: SparkRing contributors. Apache-2.0.
"""Documentation of the sparkring_job_progress action plugin (plugins/action/): it runs on the
controller, so this file holds only what ansible-doc renders (as ansible.builtin.debug does)."""

DOCUMENTATION = r"""
---
module: sparkring_job_progress
short_description: Wait for one rank's async transfer and show one progress line per interval
description:
  - An action plugin (it runs on the controller, reading the rank over its connection). It follows a
    job started with C(async) and C(poll=0) (the image and model fan-outs) until it ends.
  - Every O(interval) seconds it prints one line for this rank, read from the progress file the
    transfer agent keeps (chunks verified, MiB received, seconds, resumed and rejected chunks).
    One task header for the whole wait, not one per poll.
  - Returns the job's own result, so a failed transfer fails this task with the transfer's message.
version_added: "0.1.0"
author: SparkRing contributors
options:
  jid:
    description: The C(ansible_job_id) the async task returned.
    type: str
    required: true
  progress_path:
    description: The progress JSON the transfer agent writes on the rank.
    type: path
    required: true
  label:
    description: How the line names this rank (default the inventory host name).
    type: str
    default: ""
  interval:
    description: Seconds between progress lines.
    type: float
    default: 2.0
  timeout:
    description: Seconds to wait for the job before failing.
    type: int
    default: 3600
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: It only reads (async_status, the progress file), so it follows a check-mode job like any other.
  diff_mode:
    support: none
    details: It changes nothing itself; the job's result carries any diff.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
# After `sparkring_image_fanout: ...` with `async: 3600`, `poll: 0` and `register: job` on every rank:
- name: Follow the fan-out, one line per rank every 2 s
  sparkring_job_progress:
    jid: "{{ job.ansible_job_id }}"
    progress_path: "/var/lib/sparkring/images/{{ manifest.name }}.progress.json"
    label: "rank {{ sparkring_rank }}"
"""

RETURN = r"""
changed:
  description: The job's own C(changed).
  returned: always
  type: bool
msg:
  description: The job's message (its failure reason when it failed).
  returned: when the job returned one
  type: str
"""
