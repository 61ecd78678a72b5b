"""Preflight on the simulated ring with one fault injected per case: each run fails with the
check ID and the cable named, and every fault is undone (the ring is shared)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.sim,
    pytest.mark.extended("preflight on the ring with one fault injected per case, a preflight.yml run each"),
]

# The cable every fault goes on: rank 1's port toward rank 2.
RANK, PEER = "r1", "r2"


def _port(hostvars: dict, host: str, peer: str) -> dict:
    return next(port for port in hostvars[host]["sparkring_ports"] if port["peer_host"] == peer)


def _edge(hostvars: dict, host: str, peer: str, twin: int = 0) -> str:
    """The subject of a check on one twin of the cable: `r1 cage1 <-> r2 cage1 (ring1)`."""
    port = _port(hostvars, host, peer)
    cable = f"r{hostvars[host]['sparkring_rank']} cage{port['cage']} <-> r{port['peer_rank']} cage{port['peer_cage']}"
    return f"{cable} ({port['twins'][twin]['interface']})"


def _ip(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "-n", f"sr-{host}", *args], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def fault(inject: list[list[str]], undo: list[list[str]]) -> Iterator[None]:
    """Apply `ip` commands (host first), and always run the undo list, every step of it."""
    try:
        for host, *args in inject:
            done = _ip(host, *args)
            assert done.returncode == 0, f"injecting {args} on {host}: {done.stderr}"
        yield
    finally:
        errors = [(args, done.stderr) for host, *args in undo if (done := _ip(host, *args)).returncode != 0]
        assert not errors, f"could not undo the fault: {errors}"


def _failed(reports: Path, host_rank: int) -> list[tuple[str, str, str]]:
    report = json.loads((reports / f"rank{host_rank}.json").read_text())
    return [(c["id"], c["subject"], c["detail"]) for c in report["checks"] if c["status"] == "fail"]


def _cable_failed(reports: Path, host_rank: int) -> list[tuple[str, str, str]]:
    """The failed checks on a cable end (`rX cageN <-> rY cageM (iface)`), leaving out the node's
    own checks (disk, engine, GPU), which a host short of disk fails whatever the ring does."""
    return [f for f in _failed(reports, host_rank) if "<->" in f[1]]


def _assert_failed_run(done: subprocess.CompletedProcess[str], check_id: str, edge: str) -> None:
    assert done.returncode != 0, "preflight passed with a fault on the ring"
    assert f"{check_id} [{edge}]" in done.stdout, done.stdout[-3000:]
    assert "fix:" in done.stdout


def _link(host: str, iface: str) -> dict:
    return json.loads(_ip(host, "-j", "addr", "show", "dev", iface).stdout)[0]


def test_mtu_1500_on_one_cable(hostvars, run_preflight):
    a, b = _port(hostvars, RANK, PEER)["interface"], _port(hostvars, PEER, RANK)["interface"]
    mtu = str(hostvars[RANK]["sparkring_mtu"])
    with fault(
        [[RANK, "link", "set", a, "mtu", "1500"], [PEER, "link", "set", b, "mtu", "1500"]],
        [[RANK, "link", "set", a, "mtu", mtu], [PEER, "link", "set", b, "mtu", mtu]],
    ):
        done, reports = run_preflight("--limit", f"{RANK},{PEER}")
    edge = _edge(hostvars, RANK, PEER)
    _assert_failed_run(done, "PF-LINK-MTU", edge)
    failed = _failed(reports, hostvars[RANK]["sparkring_rank"])
    assert ("PF-LINK-MTU", edge) in [(i, s) for i, s, _ in failed]
    assert ("PF-JUMBO-PING", edge) in [(i, s) for i, s, _ in failed]
    assert any("MTU 1500, expected 9000" in d for i, _, d in failed if i == "PF-LINK-MTU")
    # Only that cable: rank 1's other port is untouched and passes.
    assert {s for _, s, _ in _cable_failed(reports, hostvars[RANK]["sparkring_rank"])} == {edge}, failed
    assert _link(RANK, a)["mtu"] == int(mtu) and _link(PEER, b)["mtu"] == int(mtu)


def test_link_down(hostvars, run_preflight):
    b = _port(hostvars, PEER, RANK)["interface"]
    with fault([[PEER, "link", "set", b, "down"]], [[PEER, "link", "set", b, "up"]]):
        done, reports = run_preflight("--limit", f"{RANK},{PEER}")
    edge = _edge(hostvars, RANK, PEER)
    _assert_failed_run(done, "PF-LINK-UP", edge)
    failed = _failed(reports, hostvars[RANK]["sparkring_rank"])
    assert ("PF-LINK-UP", edge) in [(i, s) for i, s, _ in failed]
    assert ("PF-LINK-UP", _edge(hostvars, PEER, RANK)) in [
        (i, s) for i, s, _ in _failed(reports, hostvars[PEER]["sparkring_rank"])
    ]
    assert "UP" in _link(PEER, b)["flags"]


def test_second_twin_down_is_named(hostvars, run_preflight):
    """A cage's second twin carries no address, yet preflight checks it like the first."""
    b = _port(hostvars, PEER, RANK)["twins"][1]["interface"]
    with fault([[PEER, "link", "set", b, "down"]], [[PEER, "link", "set", b, "up"]]):
        done, reports = run_preflight("--limit", PEER)
    edge = _edge(hostvars, PEER, RANK, twin=1)
    _assert_failed_run(done, "PF-LINK-UP", edge)
    failed = _cable_failed(reports, hostvars[PEER]["sparkring_rank"])
    assert [(i, s) for i, s, _ in failed] == [("PF-LINK-UP", edge)], failed
    assert "UP" in _link(PEER, b)["flags"]


def test_wrong_address_on_one_port(hostvars, run_preflight):
    port = _port(hostvars, RANK, PEER)
    iface, good = port["interface"], port["cidr"]
    wrong = f"{port['subnet'].rsplit('.', 1)[0]}.99/{port['prefix']}"
    with fault(
        [[RANK, "addr", "del", good, "dev", iface], [RANK, "addr", "add", wrong, "dev", iface]],
        [[RANK, "addr", "del", wrong, "dev", iface], [RANK, "addr", "add", good, "dev", iface]],
    ):
        done, reports = run_preflight("--limit", f"{RANK},{PEER}")
    edge = _edge(hostvars, RANK, PEER)
    _assert_failed_run(done, "PF-LINK-ADDR", edge)
    failed = _failed(reports, hostvars[RANK]["sparkring_rank"])
    assert [(i, s) for i, s, d in failed if wrong in d] == [("PF-LINK-ADDR", edge)]
    # The neighbour's jumbo ping to the address it expects finds nobody.
    peer_failed = _failed(reports, hostvars[PEER]["sparkring_rank"])
    assert ("PF-JUMBO-PING", _edge(hostvars, PEER, RANK)) in [(i, s) for i, s, _ in peer_failed]
    configured = [
        f"{a['local']}/{a['prefixlen']}" for a in _link(RANK, iface)["addr_info"] if a["family"] == "inet"
    ]
    assert configured == [good]


def test_unreachable_rank_fails_pf_ssh(hostvars, run_preflight):
    """Nothing injected on the ring: rank 0's ssh port is wrong for this run only."""
    done, reports = run_preflight("--limit", "r0", "-e", "ansible_port=1")
    _assert_failed_run(done, "PF-SSH", "r0")
    report = json.loads((reports / "rank0.json").read_text())
    assert report["status"] == "fail"
    assert [(c["id"], c["status"]) for c in report["checks"]] == [("PF-SSH", "fail")]
    assert ":1 failed" in report["checks"][0]["detail"]
