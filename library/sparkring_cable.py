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
  - "Every twin of the port (a Spark cage is two netdev/RDMA functions) is checked by the
    rules it shares with preflight (C(module_utils/sparkring_ring_checks)): the interface
    exists with carrier and operstate up; the exact negotiated speed where the driver
    reports one; the exact MTU; exactly the port address on the first twin and no IPv4
    address on another; on C(verbs) the RDMA device bound to that netdev, its port ACTIVE,
    and the GID at the configured index RoCE v2: the first twin's equal to the IPv4-mapped
    address, another twin's link-local (C(auto) resolves either)."
  - "Then: which port is at the other end of every twin (a link-layer beacon exchange: cage
    matching); a direct route to the peer from the first twin (no gateway); a
    don't-fragment ping of MTU-28 bytes."
  - Then traffic with the transport probe (C(python -m transport probe)) on this cable
    only, in both directions (on C(verbs) striped over every twin), once per frame size
    (12 KiB and 16 KiB by default) for N iterations, every payload verified. It measures the ping-pong p50/p99 latency and the
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
  host:
    description: This node's inventory host name (the beacon announces it).
    type: str
    required: true
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
    description: The exact negotiated speed; null (or a driver that reports none) skips CQ-LINK-SPEED.
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
  - sparkring_ring_port.cable_end
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
    announce: "{{ sparkring_ports | rejectattr('cage', 'eq', 0) | list }}"
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
  sample: {status: failed, failure_domain: mtu, fix: set MTU 9000 on ring1 ..., reasons: ["CQ-LINK-MTU: ring1 MTU 1500, expected 9000"]}
checks:
  description: One result per check, in order.
  returned: always
  type: list
  elements: dict
  contains:
    id: {description: Check ID such as CQ-LINK-MTU., type: str}
    status: {description: pass, warn, fail or skip., type: str}
    domain: {description: The failure domain this check belongs to., type: str}
    subject: {description: 'The cable and twin checked, C(r1 cage1 <-> r2 cage1 (ring1)).', type: str}
    detail: {description: Measured against expected, or why it was skipped., type: str}
    fix: {description: What to do when it failed or warned., type: str}
neighbor:
  description: The identity the other end's beacon announced to the first twin (cluster, host, rank, cage, twin, interface, edge); null if none was heard.
  returned: always
  type: dict
measurements:
  description: "Per frame size: ping-pong latency (this end initiating) and the bandwidth each way; per twin interface the error counter deltas, the beacon heard and (verbs) the resolved GID index."
  returned: always
  type: dict
  sample:
    frames: [{size_bytes: 12288, iterations: 200, mismatches: 0, rtt_us: {p50: 69.3, p99: 140.2}, tx_gbit_s: 0.37, rx_gbit_s: 0.35}]
    counters_delta: {ring1: {rx_crc_errors: 0, rx_dropped: 0, carrier_changes: 0}}
"""

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_link_facts import (
    SYSFS,
    Beacon,
    Route,
    exchange_beacons,
    read_counters,
    route_to,
)
from ansible.module_utils.sparkring_ring_checks import (
    RING_PORT_OPTIONS,
    Check,
    TwinFacts,
    edge_subject,
    jumbo_check,
    jumbo_reply,
    port_argument_problems,
    read_twin,
    twin_checks,
    twin_subject,
    verdict,
)

# ---- judgements of this module's own checks: facts in, checks out (pure) ----


def judge_neighbor(
    cluster: str, rank: int, port: dict[str, Any], twin: int, beacon: Beacon | None, link_up: bool
) -> Check:
    """Cage matching: the other end of this twin's cable must be the inventory's peer port."""
    subject, iface = twin_subject(rank, port, twin), port["twins"][twin]["interface"]
    if not link_up:
        return Check("CQ-NEIGHBOR", "skip", "cabling", subject, "link is not up (see CQ-LINK-UP)")
    if beacon is None:
        return Check(
            "CQ-NEIGHBOR", "skip", "cabling", subject, "no beacon exchange (check mode without peer)"
        )
    heard = beacon.heard
    want = f"r{port['peer_rank']} cage{port['peer_cage']}"
    here = f"r{rank} cage{port['cage']}"
    if heard is None:
        return Check(
            "CQ-NEIGHBOR",
            "fail",
            "cabling",
            subject,
            f"no beacon from the other end of {iface} ({beacon.error}); expected {want}",
            f"run qualification on r{port['peer_rank']} at the same time, and check that the cable "
            f"in {here} goes to {want}",
        )
    got = f"r{heard.get('rank')} cage{heard.get('cage')}"
    if heard.get("cluster") != cluster:
        return Check(
            "CQ-NEIGHBOR",
            "fail",
            "cabling",
            subject,
            f"the cable in {here} reaches cluster {heard.get('cluster')!r} host {heard.get('host')}; "
            f"expected {want} of {cluster}",
            f"plug the cable in {here} into {want}",
        )
    if heard.get("rank") == port["peer_rank"] and heard.get("cage") == port["peer_cage"]:
        return Check(
            "CQ-NEIGHBOR",
            "pass",
            "cabling",
            subject,
            f"{iface} in {here} reaches {got} ({heard.get('interface')})",
        )
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
        subject,
        f"the cable in {here} reaches {got} ({heard.get('host')} {heard.get('interface')}); expected {want}",
        fix,
    )


def judge_route(rank: int, port: dict[str, Any], route: Route | None) -> Check:
    """The peer address is directly on the address twin: no gateway, no other interface."""
    iface, peer, subject = port["interface"], port["peer_address"], twin_subject(rank, port, 0)
    if route is not None and route.dev == iface and route.gateway is None and route.type == "unicast":
        return Check("CQ-ROUTE", "pass", "addressing", subject, f"{peer} is directly on {iface}")
    found = "no route" if route is None else f"via {route.gateway or 'direct'} dev {route.dev} ({route.type})"
    return Check(
        "CQ-ROUTE",
        "fail",
        "addressing",
        subject,
        f"route to peer {peer}: {found}; expected directly on {iface}",
        f"remove routes that capture {port.get('subnet') or peer} elsewhere and keep only the "
        f"connected route of {iface} (run the fabric stage)",
    )


def judge_counters(subject: str, interface: str, before: dict, after: dict) -> tuple[Check, dict[str, int]]:
    delta = {
        name: after[name] - before[name]
        for name in before
        if before[name] is not None and after.get(name) is not None
    }
    grew = {name: value for name, value in delta.items() if value > 0}
    if not grew:
        return Check(
            "CQ-COUNTERS", "pass", "errors", subject, f"no error counter of {interface} moved"
        ), delta
    moved = ", ".join(f"{name} +{value}" for name, value in sorted(grew.items()))
    return (
        Check(
            "CQ-COUNTERS",
            "fail",
            "errors",
            subject,
            f"{interface} counters moved during the traffic: {moved}",
            "CRC/frame errors or carrier changes: clean or replace the cable and transceivers; drops: "
            f"check `ethtool -S {interface}` and the MTU on both ends",
        ),
        delta,
    )


def judge_frames(
    size: int, subject: str, doc: dict[str, Any] | None, error: str | None
) -> tuple[Check, dict | None]:
    """One probe run: ran, every payload verified both ways."""
    cid = f"CQ-PROBE-{size // 1024}K"
    fix = (
        "the probe could not carry verified traffic: check the other end's verdict, that the "
        "build stage installed the transport on both ends, and the rendezvous port is free"
    )
    if error is not None or doc is None:
        return Check(cid, "fail", "transport", subject, f"{size} B frames: {error}", fix), None
    link = (doc.get("links") or [None])[0]
    if not doc.get("ok") or link is None:
        detail = f"{size} B frames: {doc.get('error') or 'no link result'}"
        return Check(cid, "fail", "transport", subject, detail, fix), None
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
        return Check(cid, "fail", "transport", subject, detail, "payloads arrived corrupted: " + fix), frame
    return Check(cid, "pass", "transport", subject, detail), frame


def judge_performance(
    subject: str, frames: list[dict[str, Any]], max_rtt_p99_us: float | None, min_gbit_s: float | None
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
            "CQ-PERF",
            "skip",
            "performance",
            subject,
            "no absolute limits set (max_rtt_p99_us, min_bandwidth_gbit_s)",
        )
    if not warnings:
        return Check(
            "CQ-PERF", "pass", "performance", subject, "within max_rtt_p99_us / min_bandwidth_gbit_s"
        )
    return Check(
        "CQ-PERF",
        "warn",
        "performance",
        subject,
        "; ".join(warnings),
        "a slow link still works but holds back every collective: check for shaping, a degraded "
        "cable or a busy node, and compare with the other edges",
    )


# ---- the qualifier: reads facts on the node and runs the probe ----


class CableQualifier:
    """Qualifies one cable from this end, every twin of it; `run` and the sysfs root are injectable."""

    def __init__(
        self,
        params: dict[str, Any],
        run: Callable[..., tuple[int, str, str]],
        which: Callable[[str], str],
        check_mode: bool,
        sysfs: str = SYSFS,
    ) -> None:
        self.p = params
        self.port = params["port"]
        self.rank = params["rank"]
        self.run = run
        self.check_mode = check_mode
        self.sysfs = sysfs
        self.ip_bin = which("ip")
        self.ping_bin = which("ping")
        self.checks: list[Check] = []
        self.neighbor: dict | None = None
        self.measurements: dict[str, Any] = {
            "frames": [],
            "counters_delta": {},
            "gid_indices": {},
            "heard": {},
        }

    def qualify(self) -> dict[str, Any]:
        port, fabric = self.port, self.p["fabric"]
        twins = range(len(port["twins"]))
        facts = [read_twin(port, t, fabric, self.run, self.ip_bin, self.sysfs) for t in twins]
        for t in twins:
            self.checks += twin_checks(
                "CQ",
                self.rank,
                port,
                t,
                facts[t],
                fabric=fabric,
                mtu=self.p["mtu"],
                speed_mbps=self.p["link_speed_mbps"],
            )
            if facts[t].gid is not None:
                self.measurements["gid_indices"][port["twins"][t]["interface"]] = facts[t].gid.index
        if not facts[0].link.exists:
            return self._result()
        for t in twins:
            beacon = self._beacon(t) if facts[t].link.up else None
            self.checks.append(
                judge_neighbor(self.p["cluster"], self.rank, port, t, beacon, facts[t].link.up)
            )
        route = route_to(self.run, port["peer_address"], ip=self.ip_bin)
        self.checks.append(judge_route(self.rank, port, route))
        reply = jumbo_reply(
            self.run, port, self.p["mtu"], self.p["ping_timeout_s"], self.ping_bin, facts[0].link
        )
        self.checks.append(jumbo_check("CQ", self.rank, port, self.p["mtu"], reply))
        self._traffic(facts)
        return self._result()

    def _identity(self, port: dict[str, Any], twin: int) -> dict[str, Any]:
        return {
            "cluster": self.p["cluster"],
            "host": self.p["host"],
            "rank": self.rank,
            "cage": port["cage"],
            "twin": twin,
            "interface": port["twins"][twin]["interface"],
            "edge": port["edge"],
        }

    def _beacon(self, twin: int) -> Beacon:
        """Beacon on one twin; the other ports' twins announce too, so a miscabled end hears who it is."""
        announce = {
            other["twins"][t]["interface"]: self._identity(other, t)
            for other in self.p["announce"]
            for t in range(len(other["twins"]))
        }
        iface = self.port["twins"][twin]["interface"]
        beacon = exchange_beacons(
            iface, self._identity(self.port, twin), self.p["beacon_timeout_s"], announce=announce
        )
        self.measurements["heard"][iface] = beacon.heard
        if twin == 0:
            self.neighbor = beacon.heard
        return beacon

    def _traffic(self, facts: list[TwinFacts]) -> None:
        sizes = self.p["probe"]["frame_sizes"]
        subject = edge_subject(self.rank, self.port)
        if self.check_mode:
            for size in sizes:
                self.checks.append(
                    Check(f"CQ-PROBE-{size // 1024}K", "skip", "transport", subject, "check mode: no traffic")
                )
            return
        blocking = [c for c in self.checks if c.status == "fail"]
        if blocking:
            why = f"not run: {blocking[0].id} failed first"
            for size in sizes:
                self.checks.append(Check(f"CQ-PROBE-{size // 1024}K", "skip", "transport", subject, why))
            return
        interfaces = [twin["interface"] for twin in self.port["twins"]]
        before = {iface: read_counters(iface, self.sysfs) for iface in interfaces}
        for size in sizes:
            check, frame = judge_frames(size, subject, *self._probe(size))
            self.checks.append(check)
            if frame is not None:
                self.measurements["frames"].append(frame)
        for t, iface in enumerate(interfaces):
            counters, delta = judge_counters(
                twin_subject(self.rank, self.port, t), iface, before[iface], read_counters(iface, self.sysfs)
            )
            self.checks.append(counters)
            self.measurements["counters_delta"][iface] = delta
        if self.measurements["frames"]:
            self.checks.append(
                judge_performance(
                    subject,
                    self.measurements["frames"],
                    self.p["max_rtt_p99_us"],
                    self.p["min_bandwidth_gbit_s"],
                )
            )

    def probe_spec(self) -> dict[str, Any]:
        """This end's half of a two-rank ring on this cable only (the lower rank is pair rank 0)."""
        port = self.port
        me = 0 if self.rank < port["peer_rank"] else 1
        return {
            "rank": me,
            "world": 2,
            "ports": [
                {
                    "cage": port["cage"],
                    "address": port["address"],
                    "peer_rank": 1 - me,
                    "peer_address": port["peer_address"],
                    "twins": port["twins"] if self.p["fabric"] == "verbs" else [],
                }
            ],
        }

    def probe_argv(self, size: int) -> list[str]:
        """The probe command for one frame size; the ring spec (probe_spec) goes to its stdin."""
        probe = self.p["probe"]
        return [
            probe["python"], "-m", "transport", "probe",
            "--fabric", self.p["fabric"], "--ring-spec", "-",
            "--tcp-port", str(probe["tcp_port"]),
            "--setup-timeout", f"{probe['setup_timeout_s']:g}", "--timeout", f"{probe['timeout_s']:g}",
            "--pingpong-size", str(size), "--pingpong-iters", str(probe["iterations"]),
            "--bw-size", str(size), "--bw-iters", str(probe["iterations"]),
            "--burn", "none",
        ]  # fmt: skip

    def _probe(self, size: int) -> tuple[dict[str, Any] | None, str | None]:
        probe = self.p["probe"]
        if not os.path.isdir(os.path.join(probe["pythonpath"], "transport")):
            return (
                None,
                f"no transport package under {probe['pythonpath']}: run the build stage (playbooks/build.yml)",
            )
        rc, out, err = self.run(self.probe_argv(size), data=json.dumps(self.probe_spec()))
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
                "interfaces": [twin["interface"] for twin in port["twins"]],
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
    p = module.params
    problems = port_argument_problems(p["port"], p["fabric"])
    sizes = p["probe"]["frame_sizes"]
    if not sizes or any(size < 1024 for size in sizes) or p["probe"]["iterations"] < 1:
        problems.append(f"probe.frame_sizes {sizes} and probe.iterations must be >= 1024 bytes and >= 1")
    if problems:
        module.fail_json(msg="; ".join(problems))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "rank": {"type": "int", "required": True},
            "host": {"type": "str", "required": True},
            "port": {"type": "dict", "required": True, "options": RING_PORT_OPTIONS},
            "announce": {"type": "list", "elements": "dict", "default": [], "options": RING_PORT_OPTIONS},
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

    def run(argv: list[str], data: str | None = None) -> tuple[int, str, str]:
        extra = probe_env if argv[1:3] == ["-m", "transport"] else None
        return module.run_command(argv, environ_update=extra, data=data)

    def which(name: str) -> str:
        return module.get_bin_path(name, required=True, opt_dirs=["/usr/sbin", "/sbin"])

    qualifier = CableQualifier(module.params, run, which, module.check_mode, sysfs=SYSFS)
    module.exit_json(**qualifier.qualify())


if __name__ == "__main__":
    main()
