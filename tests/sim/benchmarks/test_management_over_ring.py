"""The serving benchmark's stock-ring variant on the real sim ring: inside the context every rank
reaches every other rank's management address over the ring links (the diagonal through a
forwarding neighbour), and a socket that binds no address leaves with the rank's own management
address, so the far rank can answer it; outside it, and after a run killed inside it, the ring is
as it was."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.sim


@pytest.fixture(scope="module")
def sim_network(sim_ring):
    import benchmarks.serving.sim_network as module

    return module


@pytest.fixture(scope="module")
def hostvars() -> dict[str, dict]:
    return cluster_hostvars(load_cluster_file(ROOT / "inventories" / "sim" / "cluster.yml"))


def in_rank(host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", f"sr-{host}", *argv], capture_output=True, text=True, timeout=30
    )


def state(sim_network, hostvars) -> dict:
    """What the ring looks like: forwarding, routes and the way to r2's management address."""
    return {
        host: (
            in_rank(host, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip(),
            in_rank(host, "ip", "route", "show").stdout,
        )
        for host in hostvars
    } | {"r0->r2": sim_network.route_device("r0", hostvars["r2"]["sparkring_management"]["address"])}


def test_inside_the_ranks_talk_over_the_ring_and_outside_nothing_changed(sim_network, hostvars) -> None:
    before = state(sim_network, hostvars)
    assert before["r0->r2"] == "mgmt0" and {fwd for fwd, _ in (before[h] for h in hostvars)} == {"0"}
    r2 = hostvars["r2"]["sparkring_management"]["address"]
    with sim_network.management_over_ring(hostvars):
        assert sim_network.route_device("r0", r2) == "ring0"
        counted = sim_network.interface_bytes(hostvars)
        ping = in_rank(
            "r0", "ping", "-c3", "-W2", "-I", hostvars["r0"]["sparkring_management"]["address"], r2
        )
        assert ping.returncode == 0, ping.stdout + ping.stderr
        sent = sim_network.bytes_sent_since(counted, sim_network.interface_bytes(hostvars))
        assert sent["r1"]["ring1"] > 0  # r1 forwarded the diagonal on towards r2
        # torch's TCPStore client binds no address: r2's rendezvous with r0 hung when the kernel
        # picked r2's ring address as the source, which r0 had no route back to
        for host, values in hostvars.items():
            own = values["sparkring_management"]["address"]
            for peer, peer_values in hostvars.items():
                if peer != host:
                    got = json.loads(
                        in_rank(
                            host, "ip", "-j", "route", "get", peer_values["sparkring_management"]["address"]
                        ).stdout
                    )
                    assert got[0]["prefsrc"] == own, (host, peer, got)
        unbound = in_rank("r2", "ping", "-c3", "-W2", hostvars["r0"]["sparkring_management"]["address"])
        assert unbound.returncode == 0, unbound.stdout + unbound.stderr
    assert state(sim_network, hostvars) == before
    assert not sim_network.STATE.exists()


def test_a_run_killed_inside_is_undone_by_the_next(sim_network, hostvars) -> None:
    before = state(sim_network, hostvars)
    route = sim_network.management_routes(hostvars)["r0"][1]
    sim_network.STATE.write_text(json.dumps({host: "0" for host in hostvars}))  # what a run saved first
    in_rank("r0", "sysctl", "-w", "net.ipv4.ip_forward=1")
    via = ["via", route["via"], "dev", route["dev"], "proto", sim_network.ROUTE_PROTO]
    subprocess.run(["ip", "-n", "sr-r0", "route", "replace", f"{route['to']}/32", *via], check=True)
    assert state(sim_network, hostvars) != before
    sim_network.restore_leftovers()
    assert state(sim_network, hostvars) == before and not sim_network.STATE.exists()
