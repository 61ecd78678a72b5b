#!/usr/bin/python
"""Ansible module: qualify one SparkRing cable from one of its ends."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_cable
short_description: Qualify one ring cable (edge) of a SparkRing cluster from one of its ends
description:
  - Runs on one end of a ring cable while the other end runs it at the same time (the
    C(qualify) role starts both ends in one task) and returns a structured verdict for
    the edge as seen from this end, C(qualified), C(qualified_with_warning) or C(failed)
    with a failure domain and the fix.
  - "Checks, in order: the interface exists with carrier and operstate up; the exact
    negotiated speed where the driver reports one; which port is at the other end of the
    cable (a link-layer beacon exchange: cage matching); the exact MTU; exactly the
    inventory's address and prefix; a direct route to the peer (this interface, no
    gateway); a don't-fragment ping of MTU-28 bytes; on C(verbs) the RDMA device bound to
    this netdev, its port ACTIVE, the GID at the configured index RoCE v2 and equal to the
    IPv4-mapped address (C(auto) resolves it)."
  - Then traffic with the transport probe (C(python -m transport probe)) on this cable
    only, in both directions, once per frame size (12 KiB and 16 KiB by default) for
    N iterations, every payload verified. It measures the ping-pong p50/p99 latency and the
    bandwidth of a stream of acknowledged frames each way. The interface's error counters
    (CRC, frame, errors, drops, carrier changes) are read before and after the traffic; any
    increase fails the edge.
  - A failed check is a verdict, not a module failure. The module fails only on
    arguments it cannot use. Link facts are read through C(module_utils/sparkring_link_facts),
    shared with preflight.
version_added: "0.1.0"
author: SparkRing
options:
  cluster:
    description: The cluster name; the beacon carries it so that a cable to another cluster is noticed.
    type: str
    required: true
  rank:
    description: This node's rank.
    type: int
    required: true
  port:
    description: The ring port at this end of the cable (one element of the inventory's C(sparkring_ports)).
    type: dict
    required: true
    suboptions:
      cage: {type: int, required: true, description: Cage index of the port.}
      interface: {type: str, required: true, description: Interface name.}
      edge: {type: str, required: true, description: Edge (cable) id.}
      address: {type: str, required: true, description: IPv4 address of the port.}
      prefix: {type: int, required: true, description: Prefix length.}
      cidr: {type: str, description: Address/prefix (informational).}
      subnet: {type: str, description: The edge's subnet (informational).}
      peer_rank: {type: int, required: true, description: Rank at the other end of the cable.}
      peer_host: {type: str, required: true, description: Inventory host of the peer (the beacon must name it).}
      peer_address: {type: str, required: true, description: Peer port address.}
      peer_interface: {type: str, description: Peer interface (informational).}
      peer_cage: {type: int, required: true, description: Cage of the peer port.}
      rdma_device: {type: str, description: RDMA device of the port (verbs fabric).}
      rdma_port: {type: int, description: RDMA port number (verbs fabric).}
      gid_index: {type: raw, description: 'RoCE GID index, or C(auto) to find it.'}
  host:
    description: This node's inventory host name (the beacon announces it).
    type: str
    required: true
  announce:
    description:
      - This node's other ring ports. Beacons go out there too (nothing is listened to), so
        a cable plugged into the wrong cage still reaches a port that hears who it is.
    type: list
    elements: dict
    default: []
    suboptions:
      cage: {type: int, required: true, description: Cage index of the port.}
      interface: {type: str, required: true, description: Interface name.}
      edge: {type: str, required: true, description: Edge (cable) id.}
  fabric:
    description: The ring fabric; C(verbs) adds the RDMA checks and runs the probe over RoCE.
    type: str
    required: true
    choices: [tcp, verbs]
  mtu:
    description: The exact MTU the port must have.
    type: int
    required: true
  link_speed_mbps:
    description: The exact negotiated speed; null (or a driver that reports none) skips CQ-SPEED.
    type: int
  beacon_timeout_s:
    description: Bound on the beacon exchange with the other end, seconds.
    type: float
    default: 15
  ping_timeout_s:
    description: Seconds each ping waits for a reply.
    type: int
    default: 2
  probe:
    description: How to run the transport probe on this node.
    type: dict
    default: {}
    suboptions:
      python: {type: path, default: /usr/bin/python3, description: Interpreter that runs the probe.}
      pythonpath: {type: path, default: /opt/sparkring/python, description: Where the transport package is installed (the build stage puts it there).}
      native_cache: {type: path, default: /opt/sparkring/native, description: The transport's native build cache (SPARKRING_TRANSPORT_CACHE).}
      tcp_port: {type: int, default: 18700, description: Rendezvous port (and the tcp fabric's data port) on the cable's addresses.}
      frame_sizes: {type: list, elements: int, default: [12288, 16384], description: Frame sizes in bytes; one probe run each.}
      iterations: {type: int, default: 200, description: Ping-pong round trips and streamed frames per direction, per size.}
      setup_timeout_s: {type: float, default: 20, description: Bound on the probe's rendezvous with the other end.}
      timeout_s: {type: float, default: 10, description: Bound on every transfer of the probe.}
  max_rtt_p99_us:
    description: A p99 round trip above this (any frame size) is a latency warning; null checks none here.
    type: float
  min_bandwidth_gbit_s:
    description: A bandwidth below this (any size, either direction) is a bandwidth warning; null checks none here.
    type: float
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Check mode runs the read-only checks (link, speed, beacon, MTU, address, route, ping, RDMA) and skips the probe traffic and the counter deltas.
  diff_mode:
    support: none
    details: Nothing on the node changes, so there is no diff.
  platform:
    platforms: posix
notes:
  - Needs root (the beacon uses a packet socket), C(ip) and C(ping) on the node, and the
    transport package under O(probe.pythonpath) (the C(build) stage installs it).
  - Both ends must run at the same time; the beacon and the probe wait for the other end
    for at most O(beacon_timeout_s) and O(probe.setup_timeout_s).
"""

EXAMPLES = r"""
- name: Qualify the cable in cage 0 (the other end runs the same task)
  sparkring_cable:
    cluster: "{{ sparkring_cluster_name }}"
    rank: "{{ sparkring_rank }}"
    host: "{{ inventory_hostname }}"
    port: "{{ sparkring_ports | selectattr('cage', 'eq', 0) | first }}"
    announce: [{cage: 1, interface: ring1, edge: r1-r2}]
    fabric: "{{ sparkring_fabric }}"
    mtu: "{{ sparkring_mtu }}"
    link_speed_mbps: "{{ sparkring_link_speed_mbps }}"
    probe:
      iterations: 500
  register: cable

- name: Read-only checks only (no traffic)
  sparkring_cable:
    cluster: sim
    rank: 1
    host: r1
    port: "{{ sparkring_ports[1] }}"
    fabric: tcp
    mtu: 9000
  check_mode: true
"""

RETURN = r"""
edge:
  description: The cable this end judged.
  returned: always
  type: dict
  sample: {id: r1-r2, subject: r1 cage1 <-> r2 cage1, rank: 1, cage: 1, interface: ring1, peer_rank: 2, peer_cage: 1}
verdict:
  description: The edge as seen from this end.
  returned: always
  type: dict
  contains:
    status: {description: qualified, qualified_with_warning or failed., type: str}
    failure_domain:
      description: "Where the first failure lies, most basic first: link, cabling, mtu, addressing, rdma, path, transport, errors; null unless failed."
      type: str
    fix: {description: What to do about that failure (empty unless failed)., type: str}
    reasons: {description: 'Every failed or warning check, "<ID>: <detail>".', type: list, elements: str}
  sample: {status: failed, failure_domain: mtu, fix: set MTU 9000 on ring1 ..., reasons: ["CQ-MTU: ring1 MTU 1500, expected 9000"]}
checks:
  description: One result per check, in order.
  returned: always
  type: list
  elements: dict
  contains:
    id: {description: Check ID such as CQ-MTU., type: str}
    status: {description: pass, warn, fail or skip., type: str}
    domain: {description: The failure domain this check belongs to., type: str}
    detail: {description: Measured against expected, or why it was skipped., type: str}
    fix: {description: What to do when it failed or warned., type: str}
neighbor:
  description: The identity the other end's beacon announced (cluster, host, rank, cage, interface, edge); null if none was heard.
  returned: always
  type: dict
measurements:
  description: "Per frame size: ping-pong latency (this end initiating) and the bandwidth each way; and the error counter deltas."
  returned: always
  type: dict
  sample:
    frames: [{size_bytes: 12288, iterations: 200, mismatches: 0, rtt_us: {p50: 69.3, p99: 140.2}, tx_gbit_s: 0.37, rx_gbit_s: 0.35}]
    counters_delta: {rx_crc_errors: 0, rx_dropped: 0, carrier_changes: 0}
"""

import ipaddress
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_link_facts import (
    SYSFS,
    Beacon,
    Link,
    LinkFactError,
    PingResult,
    Route,
    Runner,
    exchange_beacons,
    find_roce_v2_gid,
    ipv4_addresses,
    ipv4_mapped_gid,
    jumbo_payload,
    ping,
    rdma_netdevs,
    read_counters,
    read_gid,
    read_link,
    read_rdma_port,
    route_to,
)

# Failure domains, most basic first: the verdict names the first one that failed.
DOMAINS = ("link", "cabling", "mtu", "addressing", "rdma", "path", "transport", "errors", "performance")
QUALIFIED = "qualified"
WARNING = "qualified_with_warning"
FAILED = "failed"


@dataclass(frozen=True)
class Check:
    """One check outcome, as it appears in the verdict and the report."""

    id: str
    status: str
    domain: str
    detail: str
    fix: str = ""


def edge_subject(rank: int, port: dict[str, Any]) -> str:
    """The cable as a person finds it: both ends by rank and cage."""
    return f"r{rank} cage{port['cage']} <-> r{port['peer_rank']} cage{port['peer_cage']}"


def _both_ends(rank: int, port: dict[str, Any]) -> str:
    return f"r{rank} {port['interface']} and r{port['peer_rank']} {port.get('peer_interface') or 'its port'}"


# ---- judgements: facts in, checks out (pure; the unit tests drive these through main) ----


def judge_link(rank: int, port: dict[str, Any], link: Link) -> Check:
    iface = port["interface"]
    if not link.exists:
        return Check(
            "CQ-LINK",
            "fail",
            "link",
            f"interface {iface} does not exist",
            f"check the NIC in r{rank} cage{port['cage']} and ranks[{rank}].ring_ports interface in cluster.yml",
        )
    if link.up:
        return Check("CQ-LINK", "pass", "link", f"{iface} {link.operstate}, carrier on")
    return Check(
        "CQ-LINK",
        "fail",
        "link",
        f"{iface} is {link.operstate} (carrier {'on' if link.carrier else 'off'}); expected up with carrier",
        f"seat the cable {edge_subject(rank, port)} and bring both ends up "
        f"(`ip link set {iface} up`; run the fabric stage)",
    )


def judge_speed(port: dict[str, Any], link: Link, expected: int | None) -> Check:
    iface = port["interface"]
    if expected is None:
        return Check("CQ-SPEED", "skip", "link", "link_speed_mbps is null in cluster.yml")
    if link.speed_mbps is None:
        return Check("CQ-SPEED", "skip", "link", f"the driver of {iface} reports no speed")
    if link.speed_mbps == expected:
        return Check("CQ-SPEED", "pass", "link", f"{iface} {link.speed_mbps} Mb/s")
    return Check(
        "CQ-SPEED",
        "fail",
        "link",
        f"{iface} negotiated {link.speed_mbps} Mb/s, expected {expected}",
        f"reseat or replace the cable/transceivers; compare `ethtool {iface}` on both ends",
    )


def judge_neighbor(
    cluster: str, rank: int, port: dict[str, Any], beacon: Beacon | None, link_up: bool
) -> Check:
    """Cage matching: the other end of this cable must be the inventory's peer port."""
    if not link_up:
        return Check("CQ-NEIGHBOR", "skip", "cabling", "link is not up (see CQ-LINK)")
    if beacon is None:
        return Check("CQ-NEIGHBOR", "skip", "cabling", "no beacon exchange (check mode without peer)")
    heard = beacon.heard
    want = f"r{port['peer_rank']} cage{port['peer_cage']}"
    here = f"r{rank} cage{port['cage']}"
    if heard is None:
        return Check(
            "CQ-NEIGHBOR",
            "fail",
            "cabling",
            f"no beacon from the other end of {port['interface']} ({beacon.error}); expected {want}",
            f"run qualification on r{port['peer_rank']} at the same time, and check that the cable "
            f"in {here} goes to {want}",
        )
    got = f"r{heard.get('rank')} cage{heard.get('cage')}"
    if heard.get("cluster") != cluster:
        return Check(
            "CQ-NEIGHBOR",
            "fail",
            "cabling",
            f"the cable in {here} reaches cluster {heard.get('cluster')!r} host {heard.get('host')}; "
            f"expected {want} of {cluster}",
            f"plug the cable in {here} into {want}",
        )
    if heard.get("rank") == port["peer_rank"] and heard.get("cage") == port["peer_cage"]:
        return Check("CQ-NEIGHBOR", "pass", "cabling", f"the cable in {here} reaches {got} as cabled")
    if heard.get("rank") == port["peer_rank"]:
        fix = (
            f"the other end sits in the wrong cage: swap the two cables at r{port['peer_rank']} "
            f"(cage{heard.get('cage')} <-> cage{port['peer_cage']}); cable {port['edge']} belongs "
            f"in cage {port['cage']} on both ends"
        )
    else:
        fix = (
            f"this cable goes to the wrong neighbour: swap the two cables at r{rank} "
            f"(cage0 <-> cage1) if r{heard.get('rank')} is its other neighbour, else recable "
            f"{here} to {want}"
        )
    return Check(
        "CQ-NEIGHBOR",
        "fail",
        "cabling",
        f"the cable in {here} reaches {got} ({heard.get('host')} {heard.get('interface')}); expected {want}",
        fix,
    )


def judge_mtu(rank: int, port: dict[str, Any], link: Link, mtu: int) -> Check:
    iface = port["interface"]
    if link.mtu == mtu:
        return Check("CQ-MTU", "pass", "mtu", f"{iface} MTU {mtu}")
    return Check(
        "CQ-MTU",
        "fail",
        "mtu",
        f"MTU {link.mtu}, expected {mtu}",
        f"set MTU {mtu} on {_both_ends(rank, port)} (run the fabric stage)",
    )


def judge_address(rank: int, port: dict[str, Any], addresses: list[ipaddress.IPv4Interface]) -> Check:
    want = ipaddress.IPv4Interface(f"{port['address']}/{port['prefix']}")
    if addresses == [want]:
        return Check("CQ-ADDR", "pass", "addressing", f"{port['interface']} has exactly {want}")
    found = ", ".join(map(str, addresses)) or "none"
    return Check(
        "CQ-ADDR",
        "fail",
        "addressing",
        f"{port['interface']} has {found}, expected exactly {want}",
        f"give {port['interface']} exactly {want} (run the fabric stage), or correct "
        f"ranks[{rank}].ring_ports cage {port['cage']} in cluster.yml",
    )


def judge_route(port: dict[str, Any], route: Route | None) -> Check:
    iface, peer = port["interface"], port["peer_address"]
    if route is not None and route.dev == iface and route.gateway is None and route.type == "unicast":
        return Check("CQ-ROUTE", "pass", "addressing", f"{peer} is directly on {iface}")
    found = "no route" if route is None else f"via {route.gateway or 'direct'} dev {route.dev} ({route.type})"
    return Check(
        "CQ-ROUTE",
        "fail",
        "addressing",
        f"route to peer {peer}: {found}; expected directly on {iface}",
        f"remove routes that capture {port.get('subnet') or peer} elsewhere and keep only the "
        f"connected route of {port['interface']} (run the fabric stage)",
    )


def judge_jumbo(rank: int, port: dict[str, Any], mtu: int, reply: PingResult | None) -> Check:
    if reply is None:
        return Check("CQ-JUMBO", "skip", "path", "link is not up (see CQ-LINK)")
    probe = f"DF ping of {jumbo_payload(mtu)} B to {port['peer_address']}"
    if reply.answered:
        return Check("CQ-JUMBO", "pass", "path", f"{probe}: {reply.received}/{reply.transmitted} replies")
    return Check(
        "CQ-JUMBO",
        "fail",
        "path",
        f"{probe}: no reply ({reply.error})",
        f"MTU {mtu}, the addresses and the link must hold on both ends ({_both_ends(rank, port)}); "
        "check the other end's verdict, and that no firewall drops ICMP on the ring",
    )


def judge_counters(port: dict[str, Any], before: dict, after: dict) -> tuple[Check, dict[str, int]]:
    delta = {
        name: after[name] - before[name]
        for name in before
        if before[name] is not None and after.get(name) is not None
    }
    grew = {name: value for name, value in delta.items() if value > 0}
    if not grew:
        return Check("CQ-COUNTERS", "pass", "errors", f"no error counter of {port['interface']} moved"), delta
    moved = ", ".join(f"{name} +{value}" for name, value in sorted(grew.items()))
    return (
        Check(
            "CQ-COUNTERS",
            "fail",
            "errors",
            f"{port['interface']} counters moved during the traffic: {moved}",
            "CRC/frame errors or carrier changes: clean or replace the cable and transceivers; drops: "
            f"check `ethtool -S {port['interface']}` and the MTU on both ends",
        ),
        delta,
    )


def judge_frames(size: int, doc: dict[str, Any] | None, error: str | None) -> tuple[Check, dict | None]:
    """One probe run: ran, every payload verified both ways."""
    cid = f"CQ-PROBE-{size // 1024}K"
    fix = (
        "the probe could not carry verified traffic: check the other end's verdict, that the "
        "build stage installed the transport on both ends, and the rendezvous port is free"
    )
    if error is not None or doc is None:
        return Check(cid, "fail", "transport", f"{size} B frames: {error}", fix), None
    link = (doc.get("links") or [None])[0]
    if not doc.get("ok") or link is None:
        return Check(
            cid, "fail", "transport", f"{size} B frames: {doc.get('error') or 'no link result'}", fix
        ), None
    pp, bw = link["pingpong"] or {}, link["bandwidth"]
    mismatches = pp.get("mismatches", 0) + bw["tx"]["mismatches"] + bw["rx"]["mismatches"]
    frame = {
        "size_bytes": size,
        "iterations": pp.get("iterations", bw["iterations"]),
        "mismatches": mismatches,
        "rtt_us": pp.get("rtt_us"),
        "tx_gbit_s": bw["tx"]["gbit_s"],
        "rx_gbit_s": bw["rx"]["gbit_s"],
    }
    rtt = pp.get("rtt_us") or {}
    detail = (
        f"{size} B x {frame['iterations']}: rtt p50 {rtt.get('p50')} us p99 {rtt.get('p99')} us, "
        f"tx {frame['tx_gbit_s']} Gbit/s rx {frame['rx_gbit_s']} Gbit/s, {mismatches} mismatched"
    )
    if mismatches:
        return Check(cid, "fail", "transport", detail, "payloads arrived corrupted: " + fix), frame
    return Check(cid, "pass", "transport", detail), frame


def judge_performance(
    frames: list[dict[str, Any]], max_rtt_p99_us: float | None, min_gbit_s: float | None
) -> Check:
    """Absolute limits (the qualify role also compares every edge with the others)."""
    warnings = []
    for frame in frames:
        p99 = (frame.get("rtt_us") or {}).get("p99")
        if max_rtt_p99_us is not None and p99 is not None and p99 > max_rtt_p99_us:
            warnings.append(f"latency: {frame['size_bytes']} B rtt p99 {p99} us > {max_rtt_p99_us:g} us")
        slowest = min(frame["tx_gbit_s"], frame["rx_gbit_s"])
        if min_gbit_s is not None and slowest < min_gbit_s:
            warnings.append(f"bandwidth: {frame['size_bytes']} B {slowest} Gbit/s < {min_gbit_s:g} Gbit/s")
    if max_rtt_p99_us is None and min_gbit_s is None:
        return Check(
            "CQ-PERF", "skip", "performance", "no absolute limits set (max_rtt_p99_us, min_bandwidth_gbit_s)"
        )
    if not warnings:
        return Check("CQ-PERF", "pass", "performance", "within max_rtt_p99_us / min_bandwidth_gbit_s")
    return Check(
        "CQ-PERF",
        "warn",
        "performance",
        "; ".join(warnings),
        "a slow link still works but holds back every collective: check for shaping, a degraded "
        "cable or a busy node, and compare with the other edges",
    )


def verdict(checks: list[Check]) -> dict[str, Any]:
    """qualified / qualified_with_warning / failed (first failed domain, most basic first)."""
    failed = sorted((c for c in checks if c.status == "fail"), key=lambda c: DOMAINS.index(c.domain))
    warned = [c for c in checks if c.status == "warn"]
    reasons = [f"{c.id}: {c.detail}" for c in failed + warned]
    if failed:
        return {
            "status": FAILED,
            "failure_domain": failed[0].domain,
            "fix": failed[0].fix,
            "reasons": reasons,
        }
    status = WARNING if warned else QUALIFIED
    return {"status": status, "failure_domain": None, "fix": "", "reasons": reasons}


# ---- the qualifier: reads facts on the node and runs the probe ----


class CableQualifier:
    """Qualifies one cable from this end; `run` and the sysfs root are injectable for tests."""

    def __init__(
        self, params: dict[str, Any], run: Runner, which: Callable[[str], str], check_mode: bool
    ) -> None:
        self.p = params
        self.port = params["port"]
        self.rank = params["rank"]
        self.run = run
        self.check_mode = check_mode
        self.ip_bin = which("ip")
        self.ping_bin = which("ping")
        self.checks: list[Check] = []
        self.neighbor: dict | None = None
        self.measurements: dict[str, Any] = {"frames": [], "counters_delta": {}}

    def qualify(self) -> dict[str, Any]:
        port, iface = self.port, self.port["interface"]
        link = read_link(iface, SYSFS)
        self.checks.append(judge_link(self.rank, port, link))
        if not link.exists:
            return self._result()
        self.checks.append(judge_speed(port, link, self.p["link_speed_mbps"]))
        beacon = self._beacon() if link.up else None
        self.checks.append(judge_neighbor(self.p["cluster"], self.rank, port, beacon, link.up))
        self.checks.append(judge_mtu(self.rank, port, link, self.p["mtu"]))
        try:
            addresses = ipv4_addresses(self.run, iface, ip=self.ip_bin)
        except LinkFactError as exc:
            addresses = []
            self.checks.append(Check("CQ-ADDR", "fail", "addressing", str(exc), "check iproute2 on the node"))
        else:
            self.checks.append(judge_address(self.rank, port, addresses))
        self.checks.append(judge_route(port, route_to(self.run, port["peer_address"], ip=self.ip_bin)))
        reply = None
        if link.up:
            reply = ping(
                self.run,
                port["peer_address"],
                interface=iface,
                payload_bytes=jumbo_payload(self.p["mtu"]),
                dont_fragment=True,
                count=2,
                timeout_s=self.p["ping_timeout_s"],
                ping_bin=self.ping_bin,
            )
        self.checks.append(judge_jumbo(self.rank, port, self.p["mtu"], reply))
        self.checks += self._rdma()
        self._traffic()
        return self._result()

    def _beacon(self) -> Beacon:
        node = {"cluster": self.p["cluster"], "host": self.p["host"], "rank": self.rank}

        def identity(port: dict[str, Any]) -> dict[str, Any]:
            return {**node, "cage": port["cage"], "interface": port["interface"], "edge": port["edge"]}

        announce = {other["interface"]: identity(other) for other in self.p["announce"]}
        beacon = exchange_beacons(
            self.port["interface"], identity(self.port), self.p["beacon_timeout_s"], announce=announce
        )
        self.neighbor = beacon.heard
        return beacon

    def _rdma(self) -> list[Check]:
        port = self.port
        if self.p["fabric"] != "verbs":
            why = "tcp fabric: no RDMA device"
            return [
                Check(cid, "skip", "rdma", why) for cid in ("CQ-RDMA-BIND", "CQ-RDMA-PORT", "CQ-RDMA-GID")
            ]
        device, number, iface = port["rdma_device"], port["rdma_port"], port["interface"]
        name = f"{device} port {number}"
        fix = f"bind {device} to {iface} (check `rdma link` / the mlx5 driver) and correct ranks[{self.rank}].ring_ports rdma in cluster.yml"
        bound = rdma_netdevs(device, number, SYSFS)
        out = [
            Check("CQ-RDMA-BIND", "pass", "rdma", f"{name} is bound to {iface}")
            if iface in bound
            else Check(
                "CQ-RDMA-BIND",
                "fail",
                "rdma",
                f"{name} is bound to {sorted(bound) or 'no netdev'}; expected {iface}",
                fix,
            )
        ]
        state = read_rdma_port(device, number, SYSFS)
        if state.active:
            out.append(Check("CQ-RDMA-PORT", "pass", "rdma", f"{name} ACTIVE ({state.phys_state})"))
        else:
            out.append(
                Check(
                    "CQ-RDMA-PORT",
                    "fail",
                    "rdma",
                    f"{name} is {state.state if state.exists else 'missing'}; expected ACTIVE",
                    f"bring {iface} up with carrier; check `ibv_devinfo -d {device}`",
                )
            )
        index = port.get("gid_index")
        want = ipv4_mapped_gid(port["address"])
        gid = (
            find_roce_v2_gid(device, number, port["address"], SYSFS)
            if index == "auto"
            else read_gid(device, number, int(index), SYSFS)
        )
        gid_fix = f"{iface} needs {port['address']} (RoCE v2 derives the GID from it); use gid_index auto or the index `show_gids` lists"
        if gid is None:
            where = "no RoCE v2 entry" if index == "auto" else f"index {index} is empty"
            out.append(
                Check("CQ-RDMA-GID", "fail", "rdma", f"{name}: {where}; expected RoCE v2 GID {want}", gid_fix)
            )
        elif gid.gid != want or gid.type != "RoCE v2":
            out.append(
                Check(
                    "CQ-RDMA-GID",
                    "fail",
                    "rdma",
                    f"{name} GID index {gid.index}: {gid.gid} {gid.type}; expected {want} RoCE v2",
                    gid_fix,
                )
            )
        else:
            out.append(
                Check("CQ-RDMA-GID", "pass", "rdma", f"{name} GID index {gid.index} = {want}, RoCE v2")
            )
            self.measurements["gid_index"] = gid.index
        return out

    def _traffic(self) -> None:
        sizes = self.p["probe"]["frame_sizes"]
        if self.check_mode:
            for size in sizes:
                self.checks.append(
                    Check(f"CQ-PROBE-{size // 1024}K", "skip", "transport", "check mode: no traffic")
                )
            return
        blocking = [c for c in self.checks if c.status == "fail"]
        if blocking:
            why = f"not run: {blocking[0].id} failed first"
            for size in sizes:
                self.checks.append(Check(f"CQ-PROBE-{size // 1024}K", "skip", "transport", why))
            return
        iface = self.port["interface"]
        before = read_counters(iface, SYSFS)
        for size in sizes:
            check, frame = judge_frames(size, *self._probe(size))
            self.checks.append(check)
            if frame is not None:
                self.measurements["frames"].append(frame)
        counters, delta = judge_counters(self.port, before, read_counters(iface, SYSFS))
        self.checks.append(counters)
        self.measurements["counters_delta"] = delta
        if self.measurements["frames"]:
            self.checks.append(
                judge_performance(
                    self.measurements["frames"], self.p["max_rtt_p99_us"], self.p["min_bandwidth_gbit_s"]
                )
            )

    def probe_argv(self, size: int) -> list[str]:
        """This end's half of a two-rank probe on this cable only (lower rank is pair rank 0)."""
        probe, port = self.p["probe"], self.port
        me = 0 if self.rank < port["peer_rank"] else 1
        argv = [
            probe["python"], "-m", "transport", "probe",
            "--fabric", self.p["fabric"],
            "--world", "2", "--rank", str(me),
            "--port", f"{port['cage']},{port['address']},{1 - me},{port['peer_address']}",
            "--tcp-port", str(probe["tcp_port"]),
            "--setup-timeout", f"{probe['setup_timeout_s']:g}", "--timeout", f"{probe['timeout_s']:g}",
            "--pingpong-size", str(size), "--pingpong-iters", str(probe["iterations"]),
            "--bw-size", str(size), "--bw-iters", str(probe["iterations"]),
            "--burn", "none",
        ]  # fmt: skip
        if self.p["fabric"] == "verbs":
            argv += ["--device", port["rdma_device"], "--rdma-port", str(port["rdma_port"])]
            argv += ["--gid-index", str(port.get("gid_index", "auto"))]
        return argv

    def _probe(self, size: int) -> tuple[dict[str, Any] | None, str | None]:
        probe = self.p["probe"]
        if not os.path.isdir(os.path.join(probe["pythonpath"], "transport")):
            return (
                None,
                f"no transport package under {probe['pythonpath']}: run the build stage (playbooks/build.yml)",
            )
        rc, out, err = self.run(self.probe_argv(size))
        try:
            doc = json.loads(out)
        except ValueError:
            return None, f"probe exit {rc}, no JSON: {(err or out).strip()[-300:]}"
        return doc, None if rc == 0 or doc.get("error") else f"probe exit {rc}: {err.strip()[-300:]}"

    def _result(self) -> dict[str, Any]:
        port = self.port
        return {
            "changed": False,
            "edge": {
                "id": port["edge"],
                "subject": edge_subject(self.rank, port),
                "rank": self.rank,
                "cage": port["cage"],
                "interface": port["interface"],
                "peer_rank": port["peer_rank"],
                "peer_cage": port["peer_cage"],
            },
            "verdict": verdict(self.checks),
            "checks": [asdict(check) for check in self.checks],
            "neighbor": self.neighbor,
            "measurements": self.measurements,
        }


def _check_arguments(module: AnsibleModule) -> None:
    """Refuse what argument_spec cannot express, naming the field and the fix."""
    port, p = module.params["port"], module.params
    for field in ("address", "peer_address"):
        try:
            ipaddress.IPv4Address(port[field])
        except ValueError:
            module.fail_json(msg=f"port.{field}: {port[field]!r} is not an IPv4 address; fix cluster.yml")
    if p["fabric"] == "verbs" and (not port.get("rdma_device") or port.get("rdma_port") is None):
        module.fail_json(
            msg=f"port cage {port['cage']}: fabric verbs needs rdma_device and rdma_port; add rdma to the port in cluster.yml"
        )
    index = port.get("gid_index")
    if p["fabric"] == "verbs" and index != "auto" and not str(index).isdigit():
        module.fail_json(msg=f"port cage {port['cage']}.gid_index: {index!r} is neither a number nor 'auto'")
    sizes = p["probe"]["frame_sizes"]
    if not sizes or any(size < 1024 for size in sizes) or p["probe"]["iterations"] < 1:
        module.fail_json(msg=f"probe.frame_sizes {sizes} and probe.iterations must be >= 1024 bytes and >= 1")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "rank": {"type": "int", "required": True},
            "host": {"type": "str", "required": True},
            "port": {
                "type": "dict",
                "required": True,
                "options": {
                    "cage": {"type": "int", "required": True},
                    "interface": {"type": "str", "required": True},
                    "edge": {"type": "str", "required": True},
                    "address": {"type": "str", "required": True},
                    "prefix": {"type": "int", "required": True},
                    "cidr": {"type": "str"},
                    "subnet": {"type": "str"},
                    "peer_rank": {"type": "int", "required": True},
                    "peer_host": {"type": "str", "required": True},
                    "peer_address": {"type": "str", "required": True},
                    "peer_interface": {"type": "str"},
                    "peer_cage": {"type": "int", "required": True},
                    "rdma_device": {"type": "str"},
                    "rdma_port": {"type": "int"},
                    "gid_index": {"type": "raw"},
                },
            },
            "announce": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "cage": {"type": "int", "required": True},
                    "interface": {"type": "str", "required": True},
                    "edge": {"type": "str", "required": True},
                },
            },
            "fabric": {"type": "str", "required": True, "choices": ["tcp", "verbs"]},
            "mtu": {"type": "int", "required": True},
            "link_speed_mbps": {"type": "int"},
            "beacon_timeout_s": {"type": "float", "default": 15},
            "ping_timeout_s": {"type": "int", "default": 2},
            "probe": {
                "type": "dict",
                "default": {},
                "options": {
                    "python": {"type": "path", "default": "/usr/bin/python3"},
                    "pythonpath": {"type": "path", "default": "/opt/sparkring/python"},
                    "native_cache": {"type": "path", "default": "/opt/sparkring/native"},
                    "tcp_port": {"type": "int", "default": 18700},
                    "frame_sizes": {"type": "list", "elements": "int", "default": [12288, 16384]},
                    "iterations": {"type": "int", "default": 200},
                    "setup_timeout_s": {"type": "float", "default": 20},
                    "timeout_s": {"type": "float", "default": 10},
                },
            },
            "max_rtt_p99_us": {"type": "float"},
            "min_bandwidth_gbit_s": {"type": "float"},
        },
        supports_check_mode=True,
    )
    _check_arguments(module)
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    probe = module.params["probe"]
    probe_env = {"PYTHONPATH": probe["pythonpath"], "SPARKRING_TRANSPORT_CACHE": probe["native_cache"]}

    def run(argv: list[str]) -> tuple[int, str, str]:
        extra = probe_env if argv[1:3] == ["-m", "transport"] else None
        return module.run_command(argv, environ_update=extra)

    def which(name: str) -> str:
        return module.get_bin_path(name, required=True, opt_dirs=["/usr/sbin", "/sbin"])

    module.exit_json(**CableQualifier(module.params, run, which, module.check_mode).qualify())


if __name__ == "__main__":
    main()
