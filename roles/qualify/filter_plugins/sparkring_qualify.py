"""Controller-side filters of the qualify role: both ends of every cable -> one verdict per edge.

`sparkring_cable` judges a cable from one end. Here the two ends become the edge's verdict
(the worse end wins, the most basic failure domain first), the edges are compared with each
other (a cable far slower than the rest of the ring is a warning), and the cage matching of
the whole ring is read from what every port heard: a rank whose two ports each reach the
other's expected neighbour has its two cables swapped. The four-rank burn's per-rank probe
documents become one gate verdict that names every failing rank.
"""

from __future__ import annotations

import ipaddress
import json
import statistics
from typing import Any

from sparkring.module_utils import load_module_utils

# The ring checks' module_utils, with what they import by name loaded first (Ansible ships them only to nodes).
_RING = load_module_utils("sparkring_link_facts", "sparkring_ring_checks")

SCHEMA = "sparkring.qualify/1"
# The module's failure domains (one list, module_utils/sparkring_ring_checks.py), plus "node":
# the module produced no result on that end.
DOMAINS = ("node", *_RING.DOMAINS)
QUALIFIED, WARNING, FAILED = "qualified", "qualified_with_warning", "failed"
# What the role registers: one sparkring_cable result per round (cage 0, then cage 1).
ROUND_RESULTS = ("qualify_round0", "qualify_round1")


def _frame(end: dict[str, Any] | None, size: int) -> dict[str, Any] | None:
    frames = ((end or {}).get("measurements") or {}).get("frames") or []
    return next((frame for frame in frames if frame["size_bytes"] == size), None)


def _summary(ends: list[dict[str, Any] | None], sizes: list[int]) -> dict[str, Any]:
    """Per frame size: rtt p50/p99 (the worse end's) and the slowest direction of either end."""
    out: dict[str, Any] = {}
    for size in sizes:
        frames = [frame for end in ends if (frame := _frame(end, size)) is not None]
        if not frames:
            continue
        out[str(size)] = {
            "rtt_p50_us": max(frame["rtt_us"]["p50"] for frame in frames),
            "rtt_p99_us": max(frame["rtt_us"]["p99"] for frame in frames),
            "bandwidth_gbit_s": min(min(frame["tx_gbit_s"], frame["rx_gbit_s"]) for frame in frames),
            "iterations": min(frame["iterations"] for frame in frames),
        }
    return out


def _bulk(ends: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The cable's bulk figures against its absolute floors: the lower cable figure of the ends that
    measured one (on verbs only the connecting end does), and its per-function figures."""
    measured = [
        bulk
        for end in ends
        if (bulk := ((end or {}).get("measurements") or {}).get("bulk"))
        and bulk.get("cable_gbit_s") is not None
    ]
    if not measured:
        return None
    slowest = min(measured, key=lambda bulk: bulk["cable_gbit_s"])
    return {
        "tool": slowest["tool"],
        "cable_gbit_s": slowest["cable_gbit_s"],
        "functions": slowest.get("functions") or {},
    }


def _end_result(host: str, hv: dict[str, Any], port: dict[str, Any]) -> dict[str, Any] | None:
    """This end's module result for the port, or None where the module did not run."""
    for result in (hv.get(name) or {} for name in ROUND_RESULTS):
        edge = result.get("edge") or {}
        if edge.get("id") == port["edge"] and "verdict" in result:
            return {
                "host": host,
                "rank": hv["sparkring_rank"],
                "cage": port["cage"],
                "interface": port["interface"],
                "verdict": result["verdict"],
                "checks": result["checks"],
                "neighbor": result.get("neighbor"),
                "measurements": result.get("measurements"),
            }
    return None


def _twin_of(check: dict[str, Any], end: dict[str, Any]) -> str:
    """The twin interface a check names in its subject ("... (ring1b)"), else the end's interface."""
    subject = check.get("subject") or ""
    return subject.rsplit("(", 1)[-1].rstrip(")") if subject.endswith(")") else end["interface"]


def _edge_verdict(ends: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Worse end wins; among failures the most basic domain (then the lower rank) names the fix."""
    failures, reasons, warned = [], [], False
    for host, end in ends.items():
        if end is None:
            why = f"no result from {host}: the module did not run there"
            failures.append(("node", why, f"make {host} reachable and see its task error above"))
            reasons.append(why)
            continue
        verdict = end["verdict"]
        reasons += [f"r{end['rank']}: {reason}" for reason in verdict["reasons"]]
        if verdict["status"] == FAILED:
            domain = verdict["failure_domain"]
            first = next(c for c in end["checks"] if c["status"] == "fail" and c["domain"] == domain)
            failures.append(
                (domain, f"{first['detail']} (at r{end['rank']} {_twin_of(first, end)})", verdict["fix"])
            )
        warned = warned or verdict["status"] == WARNING
    if failures:
        domain, headline, fix = min(failures, key=lambda item: DOMAINS.index(item[0]))
        return {
            "status": FAILED,
            "failure_domain": domain,
            "headline": headline,
            "fix": fix,
            "reasons": reasons,
        }
    headline = next((reason for reason in reasons if "CQ-PERF" in reason), "") if warned else ""
    status = WARNING if warned else QUALIFIED
    return {"status": status, "failure_domain": None, "headline": headline, "fix": "", "reasons": reasons}


def _compare_edges(
    edges: list[dict[str, Any]], sizes: list[int], latency_ratio: float, bandwidth_ratio: float
) -> None:
    """Warn on an edge far slower than the ring's median at every frame size.

    Every size must agree: a busy node can slow one run of a healthy cable, a shaped or
    degraded cable is slow in all of them. Needs three edges measured at every size.
    """
    measured = [edge for edge in edges if all(str(size) in edge["summary"] for size in sizes)]
    if len(measured) < 3:
        return
    medians = {
        size: (
            statistics.median(edge["summary"][str(size)]["rtt_p50_us"] for edge in measured),
            statistics.median(edge["summary"][str(size)]["bandwidth_gbit_s"] for edge in measured),
        )
        for size in sizes
    }
    for edge in measured:
        slow = {size: edge["summary"][str(size)]["rtt_p50_us"] / medians[size][0] for size in sizes}
        thin = {
            size: medians[size][1] / max(edge["summary"][str(size)]["bandwidth_gbit_s"], 1e-9)
            for size in sizes
        }
        notes = []
        if min(slow.values()) > latency_ratio:
            notes.append(
                "latency: rtt p50 "
                + ", ".join(f"{slow[size]:.1f}x the ring median at {size} B" for size in sizes)
                + f" (limit {latency_ratio:g}x at every size)"
            )
        if min(thin.values()) > bandwidth_ratio:
            notes.append(
                "bandwidth: "
                + ", ".join(f"1/{thin[size]:.1f} of the ring median at {size} B" for size in sizes)
                + f" (limit 1/{bandwidth_ratio:g} at every size)"
            )
        if notes:
            edge["reasons"] += [f"CQ-RING-PERF: {note}" for note in notes]
            edge["warnings"] += notes
            if edge["status"] == QUALIFIED:
                edge["status"], edge["headline"] = WARNING, notes[0]


def _cabling(
    ports: dict[tuple[int, int], dict[str, Any]], ends: dict[tuple[int, int], dict | None]
) -> list[dict]:
    """Ranks whose two cables are swapped: each port reaches the other port's expected peer.

    What each port reaches is read from both sides: a port that heard nothing (its
    neighbour had finished its round) is still known from the neighbour that heard it.
    """
    reaches: dict[tuple[int, int], tuple[int, int]] = {}
    for here, end in ends.items():
        heard = (end or {}).get("neighbor") or {}
        if isinstance(heard.get("rank"), int) and isinstance(heard.get("cage"), int):
            there = (heard["rank"], heard["cage"])
            reaches[here] = there
            reaches.setdefault(there, here)
    found = []
    for rank in sorted({rank for rank, _cage in ports}):
        mine = sorted(cage for r, cage in ports if r == rank)
        if len(mine) != 2:
            continue
        a, b = mine
        seen = {cage: reaches.get((rank, cage)) for cage in mine}
        expected = {cage: ports[(rank, cage)]["peer_rank"] for cage in mine}
        if None in seen.values() or not (seen[a][0] == expected[b] and seen[b][0] == expected[a]):
            continue
        found.append(
            {
                "rank": rank,
                "detail": (
                    f"r{rank} cage{a} reaches r{seen[a][0]} cage{seen[a][1]} and "
                    f"r{rank} cage{b} reaches r{seen[b][0]} cage{seen[b][1]}: the two cables are swapped"
                ),
                "fix": f"swap the two cables at r{rank} (cage{a} <-> cage{b})",
            }
        )
    return found


def sparkring_qualify_report(
    hostvars: dict[str, Any], hosts: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Every edge of the ring from both ends' module results: the qualify report."""
    sizes = [int(size) for size in settings["frame_sizes"]]
    hvs = {host: hostvars[host] for host in hosts}
    ports = {
        (hv["sparkring_rank"], port["cage"]): port for hv in hvs.values() for port in hv["sparkring_ports"]
    }
    host_of = {hv["sparkring_rank"]: host for host, hv in hvs.items()}
    ends = {
        (hv["sparkring_rank"], port["cage"]): _end_result(host, hv, port)
        for host, hv in hvs.items()
        for port in hv["sparkring_ports"]
    }
    edges: dict[str, dict[str, Any]] = {}
    for (rank, _cage), port in sorted(ports.items()):
        if port["edge"] in edges:
            continue
        peer = (port["peer_rank"], port["peer_cage"])
        # The cable's first end is its .1 address (cable i: rank i), as the inventory lays it out.
        first_is_me = ipaddress.IPv4Address(port["address"]) < ipaddress.IPv4Address(port["peer_address"])
        a, b = ((rank, port["cage"]), peer) if first_is_me else (peer, (rank, port["cage"]))
        a_port = ports.get(a, port)
        end_hosts = {host_of.get(key[0], f"r{key[0]}"): ends.get(key) for key in (a, b)}
        verdict = _edge_verdict(end_hosts)
        edges[port["edge"]] = {
            "id": port["edge"],
            "subject": _RING.edge_subject(a[0], a_port),
            "ends": [f"r{a[0]} cage{a[1]}", f"r{b[0]} cage{b[1]}"],
            **verdict,
            "warnings": [r.split(": ", 2)[-1] for r in verdict["reasons"] if "CQ-PERF" in r],
            "summary": _summary(list(end_hosts.values()), sizes),
            "bulk": _bulk(list(end_hosts.values())),
            "measurements": {host: (end or {}).get("measurements") for host, end in end_hosts.items()},
            "checks": {host: (end or {}).get("checks") for host, end in end_hosts.items()},
        }
    ordered = sorted(edges.values(), key=lambda edge: int(edge["ends"][0].split()[0][1:]))
    _compare_edges(
        ordered, sizes, float(settings["latency_warn_ratio"]), float(settings["bandwidth_warn_ratio"])
    )
    cabling = _cabling(ports, ends)
    for swap in cabling:
        for edge in ordered:
            if edge["failure_domain"] == "cabling" and any(
                e.startswith(f"r{swap['rank']} ") for e in edge["ends"]
            ):
                edge["fix"] = f"{swap['fix']} ({swap['detail']})"
    counts = {
        status: sum(edge["status"] == status for edge in ordered) for status in (QUALIFIED, WARNING, FAILED)
    }
    return {
        "schema": SCHEMA,
        "cluster": settings["cluster"],
        "check_mode": bool(settings.get("check_mode")),
        "status": FAILED if counts[FAILED] else (WARNING if counts[WARNING] else QUALIFIED),
        "counts": counts,
        "cabling": cabling,
        "settings": {key: value for key, value in settings.items() if key not in ("cluster", "check_mode")},
        "edges": ordered,
    }


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def sparkring_qualify_table(report: dict[str, Any]) -> str:
    """The readable table: one line per edge, then each failure's fix."""
    sizes = [str(size) for size in report["settings"]["frame_sizes"]]
    head = ["EDGE", "CABLE", "STATUS", "DOMAIN"]
    for size in sizes:
        head += [f"RTT p50/p99 us @{int(size) // 1024}K", f"Gbit/s @{int(size) // 1024}K"]
    bulk = any(edge.get("bulk") for edge in report["edges"])
    if bulk:
        head.append("BULK Gbit/s")
    rows = [head]
    for edge in report["edges"]:
        row = [edge["id"], edge["subject"], edge["status"], edge["failure_domain"] or "-"]
        for size in sizes:
            figures = edge["summary"].get(size) or {}
            row += [
                f"{_fmt(figures.get('rtt_p50_us'))}/{_fmt(figures.get('rtt_p99_us'))}",
                _fmt(figures.get("bandwidth_gbit_s"), 3),
            ]
        if bulk:
            row.append(_fmt((edge.get("bulk") or {}).get("cable_gbit_s"), 1))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        f"qualify {report['cluster']}: {report['status'].upper()} "
        + ", ".join(f"{count} {status}" for status, count in report["counts"].items())
        + (" (check mode: read-only checks, no traffic)" if report["check_mode"] else "")
    ]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    for edge in report["edges"]:
        if edge["status"] == QUALIFIED:
            continue
        lines.append(f"{edge['subject']}: {edge['headline'] or edge['status']}")
        if edge["fix"]:
            lines.append(f"  fix: {edge['fix']}")
        lines += [f"  {reason}" for reason in edge["reasons"]]
    for swap in report["cabling"]:
        lines.append(f"cabling: {swap['detail']}; fix: {swap['fix']}")
    return "\n".join(lines) + "\n"


BURN_SCHEMA = "sparkring.burn/1"


def _burn_of(host: str, hv: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """One rank's probe document, or why there is none."""
    run = hv.get("qualify_burn_run")
    if not run:
        return None, "no burn result: the task did not run there"
    if run.get("skipped"):
        return None, None
    try:
        return json.loads(run.get("stdout") or ""), None
    except ValueError:
        why = (run.get("msg") or run.get("stderr") or "").strip()[-300:]
        return None, f"no burn result (exit {run.get('rc')}): {why or 'no output'}"


def sparkring_burn_report(
    hostvars: dict[str, Any], hosts: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Every rank's burn into one verdict: failed on any mismatch, error or missing rank, naming it."""
    ranks, failures = [], []
    for host in sorted(hosts, key=lambda h: hostvars[h]["sparkring_rank"]):
        hv = hostvars[host]
        rank = hv["sparkring_rank"]
        doc, missing = _burn_of(host, hv)
        who = f"rank {rank} ({host})"
        if missing:
            failures.append(f"{who}: {missing}")
        if doc is not None and doc.get("error"):
            failures.append(f"{who}: {doc['error']}")
        burns = (doc or {}).get("burns") or []
        failures += [
            f"{who}: {b['collective']} {b['dtype']} {b['size_bytes']} B: {b['mismatches']} of {b['iterations']} "
            "results differ from the reference"
            for b in burns
            if b["mismatches"]
        ]
        ranks.append(
            {
                "rank": rank,
                "host": host,
                "ok": bool(doc and doc.get("ok")),
                "error": (doc or {}).get("error") or missing,
                "seconds": (doc or {}).get("seconds"),
                "burns": burns,
            }
        )
    ran = [r for r in ranks if r["burns"] or r["error"]]
    status = "failed" if failures else ("passed" if ran else "skipped")
    calls = sum(b["iterations"] for r in ranks for b in r["burns"])
    summary = {
        "passed": f"four-rank burn passed: {len(ranks)} ranks, {calls} collective calls, 0 mismatches",
        "failed": f"four-rank burn FAILED on {len({f.split(':')[0] for f in failures})} rank(s)",
        "skipped": "four-rank burn skipped (check mode: no traffic)",
    }[status]
    return {
        "schema": BURN_SCHEMA,
        "cluster": settings["cluster"],
        "check_mode": bool(settings.get("check_mode")),
        "status": status,
        "summary": summary,
        "failures": failures,
        "settings": {key: value for key, value in settings.items() if key not in ("cluster", "check_mode")},
        "ranks": ranks,
    }


class FilterModule:
    """sparkring_qualify_report, sparkring_qualify_table, sparkring_burn_report."""

    def filters(self) -> dict[str, Any]:
        return {
            "sparkring_qualify_report": sparkring_qualify_report,
            "sparkring_qualify_table": sparkring_qualify_table,
            "sparkring_burn_report": sparkring_burn_report,
        }
