# Copyright: SparkRing contributors. Apache-2.0.
"""Cable qualification's own judgements: the facts of one cable end in, checks out (pure; stdlib only).

library/sparkring_cable.py measures (beacons, route, probe traffic, counters, ib_write_bw) and calls
these; the ring-port rules it shares with preflight live in sparkring_ring_checks.
"""

from __future__ import annotations

from typing import Any

from ansible.module_utils.sparkring_link_facts import Beacon, Route
from ansible.module_utils.sparkring_ring_checks import Check, edge_subject, twin_subject


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


def gb(gbit: float) -> str:
    """A Gb/s figure as a person reads it: 118.1 on a Spark cable, 0.0194 on a shaped sim veth."""
    return f"{gbit:.1f}" if gbit >= 10 else f"{gbit:.3g}"


def bulk_fix(rank: int, port: dict[str, Any]) -> str:
    edge = edge_subject(rank, port)
    return (
        f"reseat or replace the cable {edge} (clean both connectors); check that cluster.yml lists both twins of "
        f"cage {port['cage']} on r{rank} and cage {port['peer_cage']} on r{port['peer_rank']} (one function carries "
        "~100 Gb/s, the cable's ~190 needs both); check each function's PCIe link (preflight PF-PCIE: a function "
        "trained at Gen5 x2 halves its share; update the node's firmware)"
    )


def judge_bulk(
    rank: int,
    port: dict[str, Any],
    method: str,
    functions: dict[str, float],
    cable: float | None,
    min_function: float | None,
    min_cable: float | None,
) -> list[Check]:
    """CQ-BW-FUNCTION (each function alone) and CQ-BW-CABLE (the cable) against their absolute floors.

    `functions` maps a twin interface to its Gb/s alone (empty where the fabric measures no function,
    tcp); `cable` is the cable's Gb/s (all functions at once). A floor of None judges nothing.
    """
    edge, out = edge_subject(rank, port), []
    for t, twin in enumerate(port["twins"]):
        iface = twin["interface"]
        if iface not in functions:
            continue
        figure, subject = functions[iface], twin_subject(rank, port, t)
        shown = f"{iface} ({twin.get('rdma_device')}) alone: {gb(figure)} Gb/s ({method})"
        if min_function is None:
            out.append(
                Check("CQ-BW-FUNCTION", "pass", "performance", subject, f"{shown}; no function floor set")
            )
        elif figure >= min_function:
            out.append(
                Check(
                    "CQ-BW-FUNCTION", "pass", "performance", subject, f"{shown}, floor {min_function:g} Gb/s"
                )
            )
        else:
            out.append(
                Check(
                    "CQ-BW-FUNCTION",
                    "fail",
                    "performance",
                    subject,
                    f"cable {edge}: {shown}, under the function floor {min_function:g} Gb/s",
                    bulk_fix(rank, port),
                )
            )
    per_function = (
        "; per function " + ", ".join(f"{i} {gb(g)}" for i, g in functions.items()) if functions else ""
    )
    if cable is None:
        return out
    shown = f"cable {edge}: {gb(cable)} Gb/s with every function at once ({method}){per_function}"
    if min_cable is None:
        out.append(Check("CQ-BW-CABLE", "pass", "performance", edge, f"{shown}; no cable floor set"))
    elif cable >= min_cable:
        out.append(Check("CQ-BW-CABLE", "pass", "performance", edge, f"{shown}; floor {min_cable:g} Gb/s"))
    else:
        out.append(
            Check(
                "CQ-BW-CABLE",
                "fail",
                "performance",
                edge,
                f"{shown}; under its floor {min_cable:g} Gb/s",
                bulk_fix(rank, port),
            )
        )
    return out


# Why a floor is not measured from this end (CQ-BW-CABLE / CQ-BW-FUNCTION skips).
NO_FLOORS = (
    "no absolute floor set (min_function_gbit_s, min_cable_gbit_s): only the ring-relative "
    "comparison judges this cable's bandwidth"
)
TCP_HAS_NO_FUNCTIONS = (
    "fabric tcp carries the cable on its address twin only: per-function floors apply on verbs (ib_write_bw)"
)


def bulk_skip(subject: str, why: str, check: str = "CQ-BW-CABLE") -> Check:
    """A floor this end does not measure, saying why."""
    return Check(check, "skip", "performance", subject, why)


def perftest_missing(rank: int, port: dict[str, Any], tool: str) -> Check:
    """CQ-BW-CABLE where the floors are set but perftest is not on this rank."""
    return Check(
        "CQ-BW-CABLE",
        "fail",
        "performance",
        edge_subject(rank, port),
        f"{tool} (perftest) is not installed on r{rank}: the cable's floors cannot be measured",
        "install perftest on every rank (`sudo apt-get install perftest`), or set "
        "qualify_min_function_gbit_s and qualify_min_cable_gbit_s to null",
    )


def judge_bulk_run(rank: int, port: dict[str, Any], record: dict[str, Any]) -> Check | None:
    """CQ-BW-CABLE where ib_write_bw left this end no figures to judge: it served (the connecting end
    judges), or the run failed. None when there are figures (judge_bulk judges them)."""
    subject, error = edge_subject(rank, port), record["error"]
    if record["role"] == "serve":
        detail = (
            f"measured and judged at r{port['peer_rank']}, where ib_write_bw connects from; this end served"
        )
        return bulk_skip(subject, detail + (f" and failed: {error}" if error else ""))
    if error is None:
        return None
    return Check(
        "CQ-BW-CABLE",
        "fail",
        "performance",
        subject,
        f"cable {subject}: the bulk bandwidth could not be measured: {error}",
        f"see r{port['peer_rank']}'s CQ-BW-CABLE (it serves); both ends need perftest and an ACTIVE "
        f"RDMA port on every twin; then {bulk_fix(rank, port)}",
    )
