"""roles/qualify/filter_plugins: both ends -> one verdict per edge, ring comparison, cage matching.

The hostvars are the sim inventory's golden hostvars (tests/unit/inventory/golden/sim.json);
each end's module result is built here the way sparkring_cable returns it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.project_code import load_project_file

ROOT = Path(__file__).resolve().parents[3]
SIZES = [12288, 16384]
SETTINGS = {
    "cluster": "sim",
    "check_mode": False,
    "frame_sizes": SIZES,
    "iterations": 100,
    "latency_warn_ratio": 4.0,
    "bandwidth_warn_ratio": 4.0,
}


PLUGIN = load_project_file("roles/qualify/filter_plugins/sparkring_qualify.py")


def _hostvars() -> dict[str, dict[str, Any]]:
    golden = json.loads((ROOT / "tests" / "unit" / "inventory" / "golden" / "sim.json").read_text())
    return golden["hostvars"]


def _end(
    port: dict[str, Any],
    status: str = "qualified",
    failed: tuple[str, str, str] | None = None,
    heard: dict[str, Any] | None = None,
    rtt: float = 60.0,
    gbit: float = 0.4,
) -> dict[str, Any]:
    """One end's module result: qualified, or failed with (check id, domain, detail)."""
    checks = [{"id": "CQ-LINK-UP", "status": "pass", "domain": "link", "detail": "up", "fix": ""}]
    verdict = {"status": status, "failure_domain": None, "fix": "", "reasons": []}
    if failed:
        check_id, domain, detail = failed
        checks.append(
            {"id": check_id, "status": "fail", "domain": domain, "detail": detail, "fix": f"fix {domain}"}
        )
        verdict = {
            "status": "failed",
            "failure_domain": domain,
            "fix": f"fix {domain}",
            "reasons": [f"{check_id}: {detail}"],
        }
    frames = (
        []
        if failed
        else [
            {
                "size_bytes": size,
                "iterations": 100,
                "mismatches": 0,
                "rtt_us": {"p50": rtt, "p99": rtt * 3},
                "tx_gbit_s": gbit,
                "rx_gbit_s": gbit,
            }
            for size in SIZES
        ]
    )
    neighbor = (
        heard
        if heard is not None
        else {"cluster": "sim", "rank": port["peer_rank"], "cage": port["peer_cage"]}
    )
    return {
        "edge": {"id": port["edge"]},
        "verdict": verdict,
        "checks": checks,
        "neighbor": neighbor,
        "measurements": {"frames": frames, "counters_delta": {}},
    }


def _ring(overrides: dict[tuple[str, int], dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Hostvars with every end's registered results (overrides by (host, cage))."""
    hostvars = _hostvars()
    for host, hv in hostvars.items():
        for port in hv["sparkring_ports"]:
            hv[f"qualify_round{port['cage']}"] = (overrides or {}).get((host, port["cage"])) or _end(port)
    return hostvars


def _port(host: str, cage: int) -> dict[str, Any]:
    return next(p for p in _hostvars()[host]["sparkring_ports"] if p["cage"] == cage)


def _report(hostvars: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return PLUGIN.sparkring_qualify_report(hostvars, sorted(hostvars), SETTINGS)


def test_a_healthy_ring_qualifies_every_edge_in_ring_order():
    report = _report(_ring())
    assert report["status"] == "qualified"
    assert [edge["id"] for edge in report["edges"]] == ["r0-r1", "r1-r2", "r2-r3", "r3-r0"]
    assert [edge["subject"] for edge in report["edges"]][3] == "r3 cage1 <-> r0 cage1"
    assert report["edges"][0]["summary"]["16384"] == {
        "rtt_p50_us": 60.0,
        "rtt_p99_us": 180.0,
        "bandwidth_gbit_s": 0.4,
        "iterations": 100,
    }
    table = PLUGIN.sparkring_qualify_table(report)
    assert table.splitlines()[0] == "qualify sim: QUALIFIED 4 qualified, 0 qualified_with_warning, 0 failed"
    assert "60.0/180.0" in table


def test_the_most_basic_domain_of_either_end_names_the_edge():
    r2, r3 = _port("r2", 0), _port("r3", 0)
    report = _report(
        _ring(
            {
                ("r2", 0): _end(
                    r2, failed=("CQ-JUMBO-PING", "path", "DF ping of 8972 B to 198.19.2.2: no reply")
                ),
                ("r3", 0): _end(r3, failed=("CQ-LINK-MTU", "mtu", "MTU 1500, expected 9000")),
            }
        )
    )
    edge = next(edge for edge in report["edges"] if edge["id"] == "r2-r3")
    assert (edge["status"], edge["failure_domain"], edge["fix"]) == ("failed", "mtu", "fix mtu")
    assert report["status"] == "failed" and report["counts"]["failed"] == 1
    assert "r2 cage0 <-> r3 cage0: MTU 1500, expected 9000 (at r3 ring0)" in PLUGIN.sparkring_qualify_table(
        report
    )


def test_a_missing_end_fails_its_edge_in_domain_node():
    hostvars = _ring()
    hostvars["r2"]["qualify_round0"] = hostvars["r2"]["qualify_round1"] = {"failed": True, "msg": "boom"}
    edges = {edge["id"]: edge for edge in _report(hostvars)["edges"]}
    assert edges["r1-r2"]["failure_domain"] == "node" and edges["r2-r3"]["failure_domain"] == "node"
    assert edges["r0-r1"]["status"] == "qualified"


def test_two_swapped_cables_at_one_rank_name_that_rank():
    cabling = "cabling"
    r1c0, r1c1 = _port("r1", 0), _port("r1", 1)
    r0c0, r2c1 = _port("r0", 0), _port("r2", 1)
    report = _report(
        _ring(
            {
                ("r1", 0): _end(
                    r1c0, failed=("CQ-NEIGHBOR", cabling, "reaches r2 cage1"), heard={"rank": 2, "cage": 1}
                ),
                ("r1", 1): _end(
                    r1c1, failed=("CQ-NEIGHBOR", cabling, "reaches r0 cage0"), heard={"rank": 0, "cage": 0}
                ),
                ("r0", 0): _end(
                    r0c0, failed=("CQ-NEIGHBOR", cabling, "reaches r1 cage1"), heard={"rank": 1, "cage": 1}
                ),
                ("r2", 1): _end(
                    r2c1, failed=("CQ-NEIGHBOR", cabling, "reaches r1 cage0"), heard={"rank": 1, "cage": 0}
                ),
            }
        )
    )
    assert [swap["rank"] for swap in report["cabling"]] == [1]
    edges = {edge["id"]: edge for edge in report["edges"]}
    for swapped in ("r0-r1", "r1-r2"):
        assert edges[swapped]["failure_domain"] == cabling
        assert edges[swapped]["fix"].startswith("swap the two cables at r1 (cage0 <-> cage1)")
    assert edges["r2-r3"]["status"] == edges["r3-r0"]["status"] == "qualified"


@pytest.mark.parametrize(("rtt", "gbit", "warning"), [(900.0, 0.4, "latency:"), (60.0, 0.02, "bandwidth:")])
def test_an_edge_far_slower_than_the_ring_gets_a_warning(rtt, gbit, warning):
    slow = {
        ("r2", 0): _end(_port("r2", 0), rtt=rtt, gbit=gbit),
        ("r3", 0): _end(_port("r3", 0), rtt=rtt, gbit=gbit),
    }
    report = _report(_ring(slow))
    edges = {edge["id"]: edge for edge in report["edges"]}
    assert edges["r2-r3"]["status"] == "qualified_with_warning"
    assert [w.split(" ")[0] for w in edges["r2-r3"]["warnings"]] == [warning]
    assert report["status"] == "qualified_with_warning"
    assert {edges[e]["status"] for e in ("r0-r1", "r1-r2", "r3-r0")} == {"qualified"}


def test_a_swap_is_found_when_one_swapped_port_heard_nothing():
    """r0 had finished round 1 before r1 listened: r1 cage1 heard nothing, r0 cage0 heard it."""
    r1c0, r1c1, r0c0 = _port("r1", 0), _port("r1", 1), _port("r0", 0)
    report = _report(
        _ring(
            {
                ("r1", 0): _end(
                    r1c0, failed=("CQ-NEIGHBOR", "cabling", "reaches r2 cage1"), heard={"rank": 2, "cage": 1}
                ),
                ("r1", 1): _end(r1c1, failed=("CQ-NEIGHBOR", "cabling", "nothing heard"), heard={}),
                ("r0", 0): _end(
                    r0c0, failed=("CQ-NEIGHBOR", "cabling", "reaches r1 cage1"), heard={"rank": 1, "cage": 1}
                ),
            }
        )
    )
    assert [swap["fix"] for swap in report["cabling"]] == ["swap the two cables at r1 (cage0 <-> cage1)"]
    assert next(e for e in report["edges"] if e["id"] == "r0-r1")["fix"].startswith(
        "swap the two cables at r1"
    )


def test_a_cable_under_its_absolute_floor_fails_its_edge_naming_the_figure():
    """The connecting end (r3) measured 118.1 Gb/s, the field's degraded cable, under the GB10 floor;
    the serving end (r2) left the verdict to it. Another edge passes its floor."""
    r2, r3 = _port("r2", 0), _port("r3", 0)
    detail = (
        "cable r3 cage0 <-> r2 cage0: 118.1 Gb/s with every function at once (ib_write_bw 65536 B for 3 s); "
        "per function ring0 97.6, ring0b 51.3; under its floor 150 Gb/s"
    )
    slow = _end(r3, failed=("CQ-BW-CABLE", "performance", detail))
    slow["measurements"]["bulk"] = {
        "tool": "ib_write_bw",
        "role": "connect",
        "cable_gbit_s": 118.1,
        "functions": {"ring0": 97.6, "ring0b": 51.3},
    }
    served = _end(r2)
    served["measurements"]["bulk"] = {
        "tool": "ib_write_bw",
        "role": "serve",
        "cable_gbit_s": None,
        "functions": {},
    }
    healthy = _end(_port("r1", 0))
    healthy["measurements"]["bulk"] = {
        "tool": "ib_write_bw",
        "role": "connect",
        "cable_gbit_s": 190.1,
        "functions": {"ring0": 98.1, "ring0b": 96.4},
    }
    report = _report(_ring({("r3", 0): slow, ("r2", 0): served, ("r1", 0): healthy}))
    edges = {edge["id"]: edge for edge in report["edges"]}
    edge = edges["r2-r3"]
    assert (edge["status"], edge["failure_domain"], edge["fix"]) == (
        "failed",
        "performance",
        "fix performance",
    )
    assert edge["headline"] == f"{detail} (at r3 ring0)"
    assert edge["bulk"] == {
        "tool": "ib_write_bw",
        "cable_gbit_s": 118.1,
        "functions": {"ring0": 97.6, "ring0b": 51.3},
    }
    assert edges["r0-r1"]["bulk"]["cable_gbit_s"] == 190.1 and edges["r1-r2"]["bulk"] is None
    table = PLUGIN.sparkring_qualify_table(report).splitlines()
    assert table[1].endswith("BULK Gbit/s")
    assert next(line for line in table if line.startswith("r2-r3")).endswith("118.1")
