"""sim-down leaves the machine as it was before sim-up.

The machine is photographed without the ring (namespaces, root-namespace links, addresses,
routes, forwarding, iptables, mounts, the paths the sim may create, processes), the ring is
brought up and given real state (an ssh session, a file in a rank's /etc/sparkring, a running
container on a rank's dockerd), taken down with playbooks/sim-down.yml, and photographed again.
The conftest runs this test first, so "without the ring" is the machine as CI found it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[3]
DEFAULTS = yaml.safe_load((ROOT / "roles/sim_ring/defaults/main.yml").read_text())
SIM_DAEMONS = ("sshd", "dockerd", "containerd", "containerd-shim", "runc")
# A container made from the host's own sleep binary: no registry, no base image needed.
CONTAINER_SCRIPT = (
    "set -euo pipefail; "
    "tar -chf - /usr/bin/sleep $(ldd /usr/bin/sleep | grep -o '/[^ ]*') 2>/dev/null "
    "| docker import - sim-lifecycle:sleep >/dev/null; "
    "docker run -d --network none sim-lifecycle:sleep /usr/bin/sleep 600"
)


def _json(argv: list[str]) -> list[dict]:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out) if out.strip() else []


def _netns_of(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def _processes() -> dict[tuple[str, str], tuple[str, str, str]]:
    """(pid, start time) -> (comm, cmdline, network namespace) for every process."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        found[(pid, rest[19])] = (comm, cmdline, _netns_of(pid))
    return found


def _iptables() -> list[str]:
    if shutil.which("iptables-save") is None:
        return []
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
    return sorted(re.sub(r"\[\d+:\d+\]", "", line) for line in out.splitlines() if not line.startswith("#"))


def snapshot() -> dict[str, object]:
    """Everything sim-up may touch on the host, as comparable values."""
    sim_paths = [*DEFAULTS["sim_ring_node_dirs"], DEFAULTS["sim_ring_state_dir"], "/run/netns"]
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        "namespaces": sorted(ns["name"] for ns in _json(["ip", "-j", "netns", "list"])),
        "links": sorted(
            (link["ifname"], link.get("linkinfo", {}).get("info_kind", ""), link["mtu"], tuple(link["flags"]))
            for link in _json(["ip", "-j", "-d", "link", "show"])
        ),
        "addresses": sorted(
            (a["ifname"], i["local"], i["prefixlen"])
            for a in _json(["ip", "-j", "addr", "show"])
            for i in a.get("addr_info", [])
        ),
        "routes": sorted(
            json.dumps(r, sort_keys=True) for r in _json(["ip", "-j", "route", "show", "table", "all"])
        ),
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        "iptables": _iptables(),
        # mount point, root, fstype, source (mount ids and options aside)
        "mounts": sorted(
            (f[4], f[3], f[f.index("-") + 1], f[f.index("-") + 2])
            for f in (line.split() for line in mountinfo)
        ),
        "paths": {path: os.path.lexists(path) for path in sim_paths},
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/sparkring-sim-*")),
    }


def leftover_processes(before: dict, after: dict) -> list[tuple[str, str, str]]:
    """New processes that belong to the sim: its daemons, its paths, or a namespace that is new."""
    namespaces = {ns for _, _, ns in before.values()}
    return [
        proc
        for key, proc in after.items()
        if key not in before
        and (proc[0].startswith(SIM_DAEMONS) or "sparkring-sim" in proc[1] or proc[2] not in namespaces)
    ]


def playbook(sim_host, name: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = sim_host.run(["ansible-playbook", f"playbooks/{name}"], timeout=900)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    return done, time.monotonic() - start


def changed_count(done: subprocess.CompletedProcess[str]) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", done.stdout))


def test_sim_down_leaves_the_machine_as_it_was(sim_host) -> None:
    was_up = sim_host.ring_is_up()
    playbook(sim_host, "sim-down.yml")
    before, procs_before = snapshot(), _processes()
    try:
        _, up_s = playbook(sim_host, "sim.yml")
        state = sim_host.run(
            ["ansible", "r1", "-m", "ansible.builtin.shell", "-a", f"executable=/bin/bash {CONTAINER_SCRIPT}"]
        )
        assert state.returncode == 0, f"could not start a container on r1:\n{state.stdout}\n{state.stderr}"
        files = sim_host.run(
            ["ansible", "sparkring", "-m", "ansible.builtin.copy", "-a", "dest=/etc/sparkring/x content=x"]
        )
        assert files.returncode == 0, files.stdout
        running = sim_host.run(["ansible", "r1", "-m", "ansible.builtin.command", "-a", "docker ps -q"])
        assert running.returncode == 0 and re.search(r"^[0-9a-f]{12}$", running.stdout, re.M), running.stdout

        _, down_s = playbook(sim_host, "sim-down.yml")
        after, procs_after = snapshot(), _processes()
        again, _ = playbook(sim_host, "sim-down.yml")
        print(f"sim-up {up_s:.1f} s, sim-down {down_s:.1f} s")  # measured figures, not asserted
    finally:
        if was_up:
            playbook(sim_host, "sim.yml")

    for key in before:
        assert after[key] == before[key], (
            f"{key} differs after sim-down: before {before[key]!r}, after {after[key]!r}"
        )
    assert leftover_processes(procs_before, procs_after) == []
    assert changed_count(again) == 0, "a second sim-down still changed something"
