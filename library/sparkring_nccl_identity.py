#!/usr/bin/python
"""Ansible module: which NCCL library the serving processes of one rank really use (AC-NCCL-IDENTITY)."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_nccl_identity
short_description: Prove which NCCL library every vLLM process of one rank's container has mapped
description:
  - Lists the processes of the rank's running container (host PIDs from C(docker top)) whose
    executable is Python (the vLLM API server, engine core and workers), and reads from each one's
    C(/proc/<pid>/maps) every mapped file whose name starts with O(library_prefix), hashing the
    exact mapped inode (C(/proc/<pid>/map_files)).
  - Passes when every such process maps exactly one copy and its sha256 is O(attested_sha256), or,
    when O(attested_sha256) is empty (a deployment without NCCL, such as the CPU sim), none at all.
  - When a process maps a second copy beside the attested one (torch ships its own libnccl), the
    second copy must be proven unused by symbol resolution, from the live process - the attested
    copy comes first in the dynamic linker's link map for its soname (so C(dlopen) by soname and
    the global lookup scope find it), and every GOT slot of every object that needs the library
    and imports a symbol starting with O(symbol_prefix) is either not bound yet or bound into the
    attested copy. The result says which case held (C(mode)).
  - A failed verdict is a result, not a module failure; the module fails only when the container
    is not running or a process cannot be read.
version_added: "0.1.0"
author: SparkRing
options:
  container:
    description: Name of the rank's vLLM container (the launch spec's C(container_name)).
    type: str
    required: true
  attested_sha256:
    description:
      - sha256 of the NCCL library the rank's attestation record names (C(image_files.nccl.sha256)).
        Empty when the deployment attests none (C(NCCL_MODE=none)).
    type: str
    default: ""
  library_prefix:
    description: File name prefix of the library family inspected.
    type: str
    default: libnccl
  symbol_prefix:
    description: Prefix of the imported symbols whose GOT slots are checked.
    type: str
    default: nccl
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
attributes:
  check_mode:
    support: full
    details: The module only reads, so check mode runs it all.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  platform:
    platforms: posix
requirements: [docker CLI on the rank, root (reading other processes' /proc/<pid>/mem)]
"""

EXAMPLES = r"""
- name: Which NCCL the serving processes map (the sim attests none)
  sparkring_nccl_identity:
    container: sparkring-rank0
    attested_sha256: "{{ record.image_files.nccl.sha256 | default('', true) }}"
  register: identity
"""

RETURN = r"""
verdict:
  description: C(status) pass or fail, C(mode) (none, single, second-proven-unused) and C(problems), one line each.
  returned: always
  type: dict
processes:
  description:
    - Per process - C(pid), C(title) (its command line), C(libraries) (path, inode, sha256, soname,
      link map index), and where two or more copies are mapped, C(first_by_soname) and C(bindings)
      (object, symbol, state bound or unbound, target).
  returned: always
  type: list
  elements: dict
container_id:
  description: The container inspected.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError, read_cmdline
from ansible.module_utils.sparkring_linkage import LibraryUse, LinkageError, identity_verdict


def container_pids(module: AnsibleModule) -> tuple[str, list[int]]:
    name = module.params["container"]
    docker = Docker(module)
    try:
        state = docker.inspect(name)
        if not state or not state["State"]["Running"]:
            module.fail_json(
                msg=f"container: {name} is not running here ({'stopped' if state else 'no such container'}); "
                "start the deployment (playbooks/launch.yml) before the acceptance gates"
            )
        return state["Id"], docker.pids(name)
    except DockerError as error:
        module.fail_json(msg=f"container: {error}")


def is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False  # exited meanwhile, or a kernel thread


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "attested_sha256": {"type": "str", "default": ""},
            "library_prefix": {"type": "str", "default": "libnccl"},
            "symbol_prefix": {"type": "str", "default": "nccl"},
            **DOCKER_HOST_OPTION,
        },
        supports_check_mode=True,
    )
    attested = module.params["attested_sha256"]
    if attested and (len(attested) != 64 or any(c not in "0123456789abcdef" for c in attested)):
        module.fail_json(msg=f"attested_sha256: {attested!r} is not a sha256 (64 lowercase hex digits)")
    container_id, pids = container_pids(module)
    use = LibraryUse(module.params["library_prefix"], module.params["symbol_prefix"])
    processes = []
    for pid in pids:
        if not is_python(pid):
            continue
        try:
            processes.append({**use.inspect(pid), "title": read_cmdline(pid)})
        except FileNotFoundError:
            continue  # the process ended between docker top and now
        except (OSError, LinkageError) as exc:
            module.fail_json(msg=f"process {pid} of {module.params['container']}: {exc}")
    if not processes:
        module.fail_json(msg=f"container: {module.params['container']} runs no Python (vLLM) process")
    module.exit_json(
        changed=False,
        container_id=container_id,
        processes=processes,
        verdict=identity_verdict(processes, attested or None),
    )


if __name__ == "__main__":
    main()
