#!/usr/bin/python
"""Ansible module: read one rank's serving state (container, attestation, cables, health) in one pass."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_rank_status
short_description: Read one rank's container state, attested image and model, ring ports and health
description:
  - Read-only. One round trip per rank gives what the status view (C(playbooks/status.yml)) and the
    recovery agent need, as the rank sees it now.
  - The container (O(container)) by C(docker container inspect) - state, exit code, start and finish
    times, OOM kill, and while it is not running the last line of its log that names an error (what
    the engine said when it stopped).
  - The attestation record the launch wrote last (O(attestation)) - image ID, the model mounts by
    manifest digest, the profile's sha256.
  - Every ring port (O(ports)) by C(/sys/class/net/<interface>/operstate) and C(carrier).
  - With O(health_url) (rank 0), the HTTP status of vLLM's C(/health) (C(null) when nothing answers).
version_added: "0.1.0"
author: SparkRing
options:
  container:
    description: Name of the rank's vLLM container.
    type: str
    required: true
  attestation:
    description: The rank's latest attestation record (C(<attest_dir>/<container>-latest.json)).
    type: path
    required: true
  ports:
    description: The rank's ring ports, each with at least C(interface) (the inventory's C(sparkring_ports)).
    type: list
    elements: dict
    default: []
  health_url:
    description: URL of vLLM's C(/health) to ask (rank 0); empty asks nothing.
    type: str
    default: ""
  health_timeout_s:
    description: Bound on the health request, seconds.
    type: float
    default: 5
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
attributes:
  check_mode:
    support: full
    details: The module only reads; check mode returns the same facts.
  diff_mode:
    support: none
    details: Nothing changes.
  platform:
    platforms: posix
requirements: [docker CLI on the rank]
"""

EXAMPLES = r"""
- name: Read this rank's state
  sparkring_rank_status:
    container: sparkring-rank{{ sparkring_rank }}
    attestation: /var/lib/sparkring/attestations/sparkring-rank{{ sparkring_rank }}-latest.json
    ports: "{{ sparkring_ports }}"
    health_url: "{{ 'http://127.0.0.1:8000/health' if sparkring_rank == 0 else '' }}"
  register: status
"""

RETURN = r"""
container:
  description: C(name), C(state) (running, exited, created, ..., or absent), C(exit_code), C(started_at),
    C(finished_at), C(oom_killed), C(last_error) (a log line, only while it is not running).
  returned: always
  type: dict
attestation:
  description: C(image_id), C(models) (mount target to manifest digest), C(profile_sha256), C(path); null
    when the rank has no record.
  returned: always
  type: dict
ports:
  description: Each port as given plus C(operstate) (up, down, absent, ...) and C(carrier) (true, false, null).
  returned: always
  type: list
  elements: dict
health:
  description: C(url) and C(status) (the HTTP status, or null when nothing answered) and C(error).
  returned: always
  type: dict
"""

import json
import re
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError

# A log line worth showing as the reason a container stopped.
ERROR_LINE = re.compile(
    r"entrypoint: exit|error|dead|stopped answering|refusing|exception|killed", re.IGNORECASE
)


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def port_state(port: dict) -> dict:
    base = f"/sys/class/net/{port['interface']}"
    carrier = read(f"{base}/carrier")
    return {
        **port,
        "operstate": read(f"{base}/operstate") or "absent",
        "carrier": None if carrier is None else carrier == "1",
    }


def health(url: str, timeout: float) -> dict:
    if not url:
        return {"url": "", "status": None, "error": ""}
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return {"url": url, "status": answer.status, "error": ""}
    except urllib.error.HTTPError as exc:
        return {"url": url, "status": exc.code, "error": exc.read().decode(errors="replace")[:500]}
    except (OSError, ValueError) as exc:
        return {"url": url, "status": None, "error": str(getattr(exc, "reason", exc))[:500]}


def attestation(path: str) -> dict | None:
    raw = read(path)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return {"path": path, "error": "unreadable record"}
    return {
        "path": path,
        "image_id": (record.get("image") or {}).get("id"),
        "models": {
            m["target"]: m.get("manifest_sha256")
            for m in record.get("mounts", [])
            if m.get("read_only") and m.get("manifest_sha256") and m.get("target", "").startswith("/models")
        },
        "profile_sha256": record.get("profile_sha256"),
    }


class RankStatus:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.engine = Docker(module)

    def container(self, name: str) -> dict:
        try:
            inspected = self.engine.inspect(name)
        except DockerError as error:  # the view shows what it cannot read rather than failing
            return {"name": name, "state": "unknown", "last_error": str(error)[-500:]}
        if inspected is None:
            return {"name": name, "state": "absent"}
        state = inspected["State"]
        found = {
            "name": name,
            "state": state.get("Status", "unknown"),
            "exit_code": state.get("ExitCode"),
            "started_at": state.get("StartedAt"),
            "finished_at": state.get("FinishedAt"),
            "oom_killed": state.get("OOMKilled", False),
            "last_error": "",
        }
        if found["state"] != "running":
            _rc, out, err = self.engine.run("logs", "--tail", "200", name)
            lines = [line for line in (out + err).splitlines() if ERROR_LINE.search(line)]
            found["last_error"] = lines[-1].strip()[-500:] if lines else ""
        return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "attestation": {"type": "path", "required": True},
            "ports": {"type": "list", "elements": "dict", "default": []},
            "health_url": {"type": "str", "default": ""},
            "health_timeout_s": {"type": "float", "default": 5},
            **DOCKER_HOST_OPTION,
        },
        supports_check_mode=True,
    )
    params = module.params
    missing = [i for i, port in enumerate(params["ports"]) if not port.get("interface")]
    if missing:
        module.fail_json(msg=f"ports[{missing[0]}].interface: missing; pass the inventory's sparkring_ports")
    status = RankStatus(module)
    module.exit_json(
        changed=False,
        container=status.container(params["container"]),
        attestation=attestation(params["attestation"]),
        ports=[port_state(port) for port in params["ports"]],
        health=health(params["health_url"], params["health_timeout_s"]),
    )


if __name__ == "__main__":
    main()
