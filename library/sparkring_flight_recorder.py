#!/usr/bin/python
"""Ansible module: dump the overlay's flight recorder of one rank's vLLM workers and read it."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_flight_recorder
short_description: Make one rank's vLLM workers dump their flight recorder and return the counters
description:
  - Finds the processes of the rank's running container whose command line holds O(process_title)
    (vLLM's workers, which run the collectives) and that catch C(SIGUSR1) (C(SigCgt) in
    C(/proc/<pid>/status), i.e. the overlay installed its recorder there; a process without the handler
    would die of the signal, so it is never sent one), sends each C(SIGUSR1), and waits (bounded) for
    the fresh C(overlay-flight-<pid>.json) each writes into O(recorder_dir), named by its PID inside
    the container.
  - Returns each dump's rank, mode, collective count and counters (C(<op>.<path>), path ring, stock,
    fallback, plus shadow comparisons and mismatches) and the dump's path on the node, for C(fetch).
    Where no worker catches the signal (C(OVERLAY_MODE=disabled)) it returns no dumps and says why.
version_added: "0.1.0"
author: SparkRing
options:
  container:
    description: Name of the rank's vLLM container.
    type: str
    required: true
  recorder_dir:
    description: Host path of the container's recorder directory (the mount at C(SPARKRING_OVERLAY_RECORDER_DIR)).
    type: path
    required: true
  process_title:
    description: Text in the command line of the processes to signal (vLLM titles its workers C(VLLM::Worker...)).
    type: str
    default: "VLLM::Worker"
  timeout_s:
    description: How long to wait for every dump, seconds.
    type: float
    default: 60
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
attributes:
  check_mode:
    support: full
    details: In check mode no signal is sent and no dump is read.
  diff_mode:
    support: none
    details: The dump is an observation, not a configuration change.
  platform:
    platforms: posix
requirements: [docker CLI on the rank, root (signalling the container's processes)]
"""

EXAMPLES = r"""
- name: Dump every rank's worker recorder
  sparkring_flight_recorder:
    container: sparkring-rank{{ sparkring_rank }}
    recorder_dir: /var/lib/sparkring/overlay
  register: flight
"""

RETURN = r"""
dumps:
  description:
    - One per signalled worker - C(pid) (host), C(ns_pid) (in the container), C(path) (on the node),
      C(rank), C(mode), C(collectives), C(counters).
  returned: always
  type: list
  elements: dict
note:
  description: Why there is no dump (no worker catches SIGUSR1), else empty.
  returned: always
  type: str
"""

import json
import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError, read_cmdline

SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


def status_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        return dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)


def workers(module: AnsibleModule) -> list[tuple[int, int]]:
    """(host pid, pid inside the container) of every worker that catches SIGUSR1."""
    try:
        pids = Docker(module).pids(module.params["container"])
    except DockerError as error:
        module.fail_json(msg=f"container: {error}")
    found = []
    for pid in pids:
        try:
            if module.params["process_title"] not in read_cmdline(pid):
                continue
            fields = status_fields(pid)
        except OSError:
            continue  # exited meanwhile
        if int(fields.get("SigCgt", "0"), 16) & SIGUSR1_BIT:
            found.append((pid, int(fields.get("NSpid", str(pid)).split()[-1])))
    return found


def read_dump(path: str, after_ns: int) -> dict | None:
    """The dump at ``path`` if it was written after ``after_ns`` by the signal handler."""
    try:
        if os.stat(path).st_mtime_ns <= after_ns:
            return None
        with open(path, encoding="utf-8") as handle:
            dump = json.load(handle)
    except (OSError, ValueError):
        return None  # not there yet, or replaced under us: poll again
    return dump if dump.get("reason") == "signal" else None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "recorder_dir": {"type": "path", "required": True},
            "process_title": {"type": "str", "default": "VLLM::Worker"},
            "timeout_s": {"type": "float", "default": 60},
            **DOCKER_HOST_OPTION,
        },
        supports_check_mode=True,
    )
    if module.check_mode:
        module.exit_json(changed=False, dumps=[], note="check mode: nothing signalled")
    targets = workers(module)
    if not targets:
        module.exit_json(
            changed=False,
            dumps=[],
            note=f"no process titled {module.params['process_title']!r} in {module.params['container']} catches "
            "SIGUSR1: the overlay's recorder is not installed (OVERLAY_MODE=disabled?)",
        )
    paths = {
        pid: os.path.join(module.params["recorder_dir"], f"overlay-flight-{ns}.json") for pid, ns in targets
    }
    sent_ns = time.time_ns() - 1_000_000_000  # mtimes are coarse: a dump from 1 s before still counts as new
    before = {pid: os.stat(p).st_mtime_ns if os.path.exists(p) else 0 for pid, p in paths.items()}
    for pid, _ns in targets:
        os.kill(pid, signal.SIGUSR1)
    deadline, dumps = time.monotonic() + module.params["timeout_s"], {}
    while len(dumps) < len(targets) and time.monotonic() < deadline:
        for pid, ns in targets:
            if pid not in dumps:
                dump = read_dump(paths[pid], max(before[pid], sent_ns))
                if dump is not None:
                    dumps[pid] = {
                        "pid": pid,
                        "ns_pid": ns,
                        "path": paths[pid],
                        "rank": dump.get("rank"),
                        "mode": dump.get("mode"),
                        "collectives": dump.get("collectives"),
                        "counters": dump.get("counters", {}),
                    }
        time.sleep(0.2)
    missing = sorted(pid for pid, _ns in targets if pid not in dumps)
    if missing:
        module.fail_json(
            msg=f"flight recorder: worker(s) {missing} of {module.params['container']} wrote no dump into "
            f"{module.params['recorder_dir']} within {module.params['timeout_s']}s; is that the recorder mount?",
            dumps=list(dumps.values()),
        )
    module.exit_json(changed=False, dumps=list(dumps.values()), note="")


if __name__ == "__main__":
    main()
