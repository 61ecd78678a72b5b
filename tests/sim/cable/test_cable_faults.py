"""Cable qualification on the simulated ring: every edge qualifies with measured latency and
bandwidth, and each injected fault is reported on the right edge with the right failure
domain (and fix). Every fault is undone in a finally: the ring is shared."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.sim

FRAME_SIZES = ("12288", "16384")


def _netns(host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """A command inside a rank's network namespace."""
    return subprocess.run(
        ["ip", "netns", "exec", f"sr-{host}", *argv], capture_output=True, text=True, timeout=60, check=False
    )


@contextlib.contextmanager
def fault(inject: list[tuple[str, list[str]]], undo: list[tuple[str, list[str]]]) -> Iterator[None]:
    """Run commands in rank namespaces (host first); always run every undo step."""
    try:
        for host, argv in inject:
            done = _netns(host, *argv)
            assert done.returncode == 0, f"injecting {argv} on {host}: {done.stderr}"
        yield
    finally:
        errors = [(argv, done.stderr) for host, argv in undo if (done := _netns(host, *argv)).returncode != 0]
        assert not errors, f"could not undo the fault: {errors}"


def _edges(report: dict) -> dict[str, dict]:
    return {edge["id"]: edge for edge in report["edges"]}


def _assert_measured(edge: dict) -> None:
    for size in FRAME_SIZES:
        figures = edge["summary"][size]
        assert figures["rtt_p50_us"] > 0 and figures["rtt_p99_us"] >= figures["rtt_p50_us"], figures
        assert figures["bandwidth_gbit_s"] > 0, figures


def test_every_edge_qualifies_with_latency_and_bandwidth(run_qualify):
    done, report = run_qualify()
    assert done.returncode == 0, done.stdout[-4000:]
    edges = _edges(report)
    assert sorted(edges) == ["r0-r1", "r1-r2", "r2-r3", "r3-r0"]
    assert {edge["status"] for edge in edges.values()} == {"qualified"}, report["edges"]
    for edge in edges.values():
        _assert_measured(edge)
        for checks in edge["checks"].values():
            assert {c["id"]: c["status"] for c in checks}["CQ-NEIGHBOR"] == "pass"
            assert {c["id"]: c["status"] for c in checks}["CQ-COUNTERS"] == "pass"


def test_mtu_1500_and_a_link_down(run_qualify):
    """r3's cage 0 port (cable r2-r3) at MTU 1500; r3's cage 1 port (cable r3-r0) down."""
    with fault(
        [
            ("r3", ["ip", "link", "set", "ring0", "mtu", "1500"]),
            ("r3", ["ip", "link", "set", "ring1", "down"]),
        ],
        [("r3", ["ip", "link", "set", "ring0", "mtu", "9000"]), ("r3", ["ip", "link", "set", "ring1", "up"])],
    ):
        done, report = run_qualify()
    assert done.returncode != 0, "qualification passed with faults on the ring"
    edges = _edges(report)
    assert (edges["r2-r3"]["status"], edges["r2-r3"]["failure_domain"]) == ("failed", "mtu")
    assert "r2 cage0 <-> r3 cage0: MTU 1500, expected 9000 (at r3 ring0)" in done.stdout
    assert (edges["r3-r0"]["status"], edges["r3-r0"]["failure_domain"]) == ("failed", "link")
    assert edges["r3-r0"]["subject"] == "r3 cage1 <-> r0 cage1"
    assert "fix:" in done.stdout
    for untouched in ("r0-r1", "r1-r2"):
        assert edges[untouched]["status"] == "qualified", edges[untouched]
        _assert_measured(edges[untouched])


def _swap_r1_cables() -> list[tuple[str, list[str]]]:
    """Swap the two cables at r1: the veths trade names, so each carries the other's addresses."""
    return [
        ("r1", argv)
        for argv in (
            ["ip", "link", "set", "ring0", "down"],
            ["ip", "link", "set", "ring1", "down"],
            ["ip", "link", "set", "ring0", "name", "ringswap"],
            ["ip", "link", "set", "ring1", "name", "ring0"],
            ["ip", "link", "set", "ringswap", "name", "ring1"],
            ["ip", "link", "set", "ring0", "up"],
            ["ip", "link", "set", "ring1", "up"],
        )
    ]


def test_swapped_cables(run_qualify):
    with fault(_swap_r1_cables(), _swap_r1_cables()):
        done, report = run_qualify()
    assert done.returncode != 0, "qualification passed with swapped cables"
    edges = _edges(report)
    for swapped in ("r0-r1", "r1-r2"):
        assert (edges[swapped]["status"], edges[swapped]["failure_domain"]) == ("failed", "cabling")
        assert edges[swapped]["fix"].startswith("swap the two cables at r1 (cage0 <-> cage1)")
    assert [swap["rank"] for swap in report["cabling"]] == [1]
    assert "swap the two cables at r1" in done.stdout
    for untouched in ("r2-r3", "r3-r0"):
        assert edges[untouched]["status"] == "qualified", edges[untouched]
    assert _netns("r1", "ip", "-j", "addr", "show", "dev", "ring0").stdout.count("198.19.0.2") == 1


def test_throttled_link_warns(run_qualify):
    """tc tbf at 20 Mbit/s on both ends of cable r2-r3: far slower than the other cables."""
    shape = [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "ring0",
        "root",
        "tbf",
        "rate",
        "20mbit",
        "burst",
        "32kb",
        "latency",
        "50ms",
    ]
    unshape = ["tc", "qdisc", "del", "dev", "ring0", "root"]
    with fault([("r2", shape), ("r3", shape)], [("r2", unshape), ("r3", unshape)]):
        done, report = run_qualify()
    assert done.returncode == 0, "a warning must not fail the stage by default"
    edges = _edges(report)
    slow = edges["r2-r3"]
    assert slow["status"] == "qualified_with_warning", slow
    assert any(w.startswith(("latency:", "bandwidth:")) for w in slow["warnings"]), slow["warnings"]
    assert report["status"] == "qualified_with_warning"
    for other in ("r0-r1", "r1-r2", "r3-r0"):
        assert edges[other]["status"] == "qualified", edges[other]
        assert (
            edges[other]["summary"]["16384"]["bandwidth_gbit_s"]
            > slow["summary"]["16384"]["bandwidth_gbit_s"]
        )


def test_docker_forward_drop_policy_does_not_touch_ring_traffic(run_qualify):
    """Docker sets the FORWARD policy to DROP; ring traffic is neighbour to neighbour and never
    forwarded (the fabric stage turns forwarding off on ring ports), so every edge still qualifies."""
    hosts = ("r0", "r1", "r2", "r3")
    policies = {h: _netns(h, "iptables", "-S", "FORWARD").stdout.splitlines()[0].split()[-1] for h in hosts}
    with fault(
        [(h, ["iptables", "-P", "FORWARD", "DROP"]) for h in hosts],
        [(h, ["iptables", "-P", "FORWARD", policies[h]]) for h in hosts],
    ):
        done, report = run_qualify("-e", '{"qualify_frame_sizes": [16384]}')
    assert done.returncode == 0, done.stdout[-4000:]
    assert {edge["status"] for edge in report["edges"]} == {"qualified"}, report["edges"]
    assert all(
        _netns(h, "iptables", "-S", "FORWARD").stdout.startswith(f"-P FORWARD {policies[h]}") for h in hosts
    )
