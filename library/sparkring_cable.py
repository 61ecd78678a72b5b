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
  - "Then, when an absolute floor is set (O(min_function_gbit_s), O(min_cable_gbit_s)), the
    cable's bulk bandwidth: on C(verbs) perftest's C(ib_write_bw) on each twin alone and on
    every twin at once (the lower rank serves, the higher connects and judges: CQ-BW-FUNCTION
    per twin, CQ-BW-CABLE), on C(tcp) the probe's slowest direction (CQ-BW-CABLE). A cable or
    function under its floor fails the edge in domain performance, naming the cable, the figure
    and the fix."
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
  min_function_gbit_s:
    description:
      - Floor of each twin's (RDMA function's) bulk bandwidth alone, Gb/s (C(verbs), C(ib_write_bw)); under it
        the edge fails (CQ-BW-FUNCTION). Null sets none; ignored on C(tcp), where one function carries the cable.
    type: float
  min_cable_gbit_s:
    description:
      - Floor of the cable's bulk bandwidth, Gb/s; under it the edge fails (CQ-BW-CABLE). On C(verbs) every twin
        at once (C(ib_write_bw) on each, summed), on C(tcp) the probe's slowest direction at any frame size.
        Null sets none.
    type: float
  bulk:
    description: How C(ib_write_bw) measures the floors on C(verbs) (perftest on both ends).
    type: dict
    default: {}
    suboptions:
      tool: {type: str, default: ib_write_bw, description: The perftest tool (looked up on the node's PATH).}
      size_bytes: {type: int, default: 65536, description: Message size (perftest's default).}
      duration_s: {type: int, default: 3, description: Seconds each stage runs (C(-D)).}
      tcp_port: {type: int, default: 18760, description: First of the TCP ports perftest exchanges its setup on (one per stage and twin).}
      timeout_s: {type: float, default: 30, description: Bound on each stage, the wait for the other end included.}
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_ring_port.cable_end
attributes:
  check_mode:
    support: full
    details: Check mode runs the read-only checks (link, speed, beacon, MTU, address, route, ping, RDMA) and skips the probe traffic, the counter deltas and the floors' measurement.
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
      description: "Where the first failure lies, most basic first: link, cabling, mtu, addressing, rdma, path, transport, errors, performance (an absolute floor); null unless failed."
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
  description: "Per frame size: ping-pong latency (this end initiating) and the bandwidth each way; per twin interface the error counter deltas, the beacon heard and (verbs) the resolved GID index; C(bulk): the floors' measurement (tool, role, per function and cable Gb/s, error), null when no floor is set."
  returned: always
  type: dict
  sample:
    frames: [{size_bytes: 12288, iterations: 200, mismatches: 0, rtt_us: {p50: 69.3, p99: 140.2}, tx_gbit_s: 0.37, rx_gbit_s: 0.35}]
    counters_delta: {ring1: {rx_crc_errors: 0, rx_dropped: 0, carrier_changes: 0}}
"""

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_cable_checks import (
    judge_counters,
    judge_frames,
    judge_neighbor,
    judge_performance,
    judge_route,
)
from ansible.module_utils.sparkring_cable_floors import measure_floors
from ansible.module_utils.sparkring_cable_probe import run_probe
from ansible.module_utils.sparkring_link_facts import (
    SYSFS,
    Beacon,
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


class CableQualifier:
    """Qualifies one cable from this end, every twin of it; `run` and the sysfs root are injectable."""

    def __init__(
        self,
        params: dict[str, Any],
        run: Callable[..., tuple[int, str, str]],
        which: Callable[..., str | None],
        check_mode: bool,
        sysfs: str = SYSFS,
    ) -> None:
        self.p = params
        self.port = params["port"]
        self.rank = params["rank"]
        self.run = run
        self.check_mode = check_mode
        self.sysfs = sysfs
        self.which = which
        self.ip_bin = which("ip")
        self.ping_bin = which("ping")
        self.checks: list[Check] = []
        self.neighbor: dict | None = None
        self.measurements: dict[str, Any] = {
            "frames": [],
            "counters_delta": {},
            "gid_indices": {},
            "heard": {},
            "bulk": None,
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
        self._bulk()
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
            check, frame = judge_frames(
                size,
                subject,
                *run_probe(self.run, self.p["probe"], self.p["fabric"], self.rank, self.port, size),
            )
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

    def _bulk(self) -> None:
        """The cable's bulk bandwidth against its absolute floors (module_utils/sparkring_cable_floors)."""
        blocking = [c for c in self.checks if c.status == "fail"]
        not_run = f"not run: {blocking[0].id} failed first" if blocking else None
        bulk, checks = measure_floors(
            self.p,
            self.run,
            self.which,
            self.measurements["gid_indices"],
            self.measurements["frames"],
            "check mode: no traffic" if self.check_mode else not_run,
        )
        self.measurements["bulk"] = bulk
        self.checks += checks

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
            "min_function_gbit_s": {"type": "float"},
            "min_cable_gbit_s": {"type": "float"},
            "bulk": {
                "type": "dict",
                "default": {},
                "options": {
                    "tool": {"type": "str", "default": "ib_write_bw"},
                    "size_bytes": {"type": "int", "default": 65536},
                    "duration_s": {"type": "int", "default": 3},
                    "tcp_port": {"type": "int", "default": 18760},
                    "timeout_s": {"type": "float", "default": 30},
                },
            },
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

    def which(name: str, required: bool = True) -> str | None:
        return module.get_bin_path(name, required=required, opt_dirs=["/usr/sbin", "/sbin"])

    qualifier = CableQualifier(module.params, run, which, module.check_mode, sysfs=SYSFS)
    module.exit_json(**qualifier.qualify())


if __name__ == "__main__":
    main()
