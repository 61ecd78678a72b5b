"""Which links the simulated ring's ranks talk over, for the serving benchmark's stock variants.

Stock vLLM on CPU runs its collectives over gloo, bound to the management interface (the launch
derives GLOO_SOCKET_IFNAME from the inventory). On the sim that path is a veth onto a bridge in
the controller namespace, MTU 1500. Stock's other configuration is the ring links, as
benchmarks/transport/bench.py gives gloo: `management_over_ring` routes every rank's traffic to
every other rank's management address over the ring cables (host routes via the neighbour on
the cable, the diagonals through a forwarding neighbour, the short way round), so gloo keeps its
addresses and sockets and its bytes cross MTU 9000 ring links. Forwarding is what a switchless
ring does not do, so it is switched on only inside the context and restored on the way out; the
values it changed are saved first in STATE, so a run killed inside the context is undone by the
next one (`restore_leftovers`).

`interface_bytes` reads every rank's interface counters, so a benchmark records which links
actually carried the bytes instead of assuming it. Needs root and the sim ring up.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROUTE_PROTO = "177"  # marks the routes this module adds (ip route ... proto 177)
STATE = Path("/run/sparkring-bench-management-over-ring.json")
FORWARDING = "net.ipv4.ip_forward"


def netns(host: str) -> str:
    """The rank's network namespace (inventories/sim: sr-<host>)."""
    return f"sr-{host}"


def _ip(*argv: str) -> str:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def _sysctl(host: str, key: str, value: str | None = None) -> str:
    argv = ["ip", "netns", "exec", netns(host), "sysctl", "-n" if value is None else "-w"]
    argv.append(key if value is None else f"{key}={value}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def management_routes(hostvars: dict[str, dict]) -> dict[str, list[dict[str, str]]]:
    """Per rank, one host route to each other rank's management address over a ring cable.

    A neighbour is reached over the cable joining the two; a rank further round goes through the
    neighbour on the shorter side (ties go right), which forwards it on. Each route names the rank's
    own management address as the source: a socket that binds no address (torch's TCPStore client)
    would otherwise leave with the ring port's address, which the far rank of a diagonal has no
    route back to (the rendezvous then hangs)."""
    by_rank = {values["sparkring_rank"]: host for host, values in hostvars.items()}
    world = len(by_rank)
    routes: dict[str, list[dict[str, str]]] = {}
    for host, values in hostvars.items():
        rank = values["sparkring_rank"]
        ports = {port["peer_rank"]: port for port in values["sparkring_ports"]}
        routes[host] = []
        for peer in sorted(by_rank):
            if peer == rank:
                continue
            ahead = (peer - rank) % world
            hop = peer if peer in ports else (rank + 1) % world if ahead <= world // 2 else (rank - 1) % world
            port = ports[hop]
            routes[host].append(
                {
                    "to": hostvars[by_rank[peer]]["sparkring_management"]["address"],
                    "via": port["peer_address"],
                    "dev": port["interface"],
                    "src": values["sparkring_management"]["address"],
                }
            )
    return routes


def restore_leftovers() -> None:
    """Undo what a killed run left: its routes (by their proto) and the forwarding it saved."""
    if not STATE.exists():
        return
    saved = json.loads(STATE.read_text())
    for host, forwarding in saved.items():
        _ip("-n", netns(host), "route", "flush", "proto", ROUTE_PROTO)
        _sysctl(host, FORWARDING, forwarding)
    STATE.unlink()


@contextlib.contextmanager
def management_over_ring(hostvars: dict[str, dict]) -> Iterator[dict[str, list[dict[str, str]]]]:
    """Inside: every rank reaches every other rank's management address over the ring links."""
    restore_leftovers()
    routes = management_routes(hostvars)
    STATE.write_text(json.dumps({host: _sysctl(host, FORWARDING) for host in hostvars}))
    try:
        for host, host_routes in routes.items():
            _sysctl(host, FORWARDING, "1")
            for route in host_routes:
                via = ["via", route["via"], "dev", route["dev"], "src", route["src"], "proto", ROUTE_PROTO]
                _ip("-n", netns(host), "route", "replace", f"{route['to']}/32", *via)
        yield routes
    finally:
        restore_leftovers()


def route_device(host: str, address: str) -> str:
    """The interface the rank's kernel sends a packet for `address` out of (ip route get)."""
    got = json.loads(_ip("-n", netns(host), "-j", "route", "get", address))
    return got[0]["dev"]


def interface_bytes(hostvars: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Bytes each rank has sent on its management and ring interfaces so far (kernel counters)."""
    counters: dict[str, dict[str, int]] = {}
    for host, values in hostvars.items():
        names = [
            values["sparkring_management"]["interface"],
            *(p["interface"] for p in values["sparkring_ports"]),
        ]
        links = json.loads(_ip("-n", netns(host), "-j", "-s", "link", "show"))
        counters[host] = {
            link["ifname"]: link["stats64"]["tx"]["bytes"] for link in links if link["ifname"] in names
        }
    return counters


def bytes_sent_since(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict]:
    """Per rank, bytes sent on each interface between two readings."""
    return {
        host: {name: after[host][name] - count for name, count in names.items()}
        for host, names in before.items()
    }
