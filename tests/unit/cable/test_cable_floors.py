"""Absolute bandwidth floors of a cable (CQ-BW-FUNCTION, CQ-BW-CABLE): ib_write_bw on verbs, the probe on tcp.

The field's figures for a Spark cable (docs/qualify.md, "Absolute floors"): healthy about 190 Gb/s with
both functions at once and 92-111 Gb/s per function (ib_write_bw), degraded about 118 Gb/s. The
ib_write_bw text below has the layout perftest prints (a result table after a header row; in -D mode
a "Conflicting CPU frequency" warning can sit between the two); the command runner answers it per
argv, so the module's own argv building, staging, retrying and judging run for real.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils import sparkring_rdma_bw as rdma_bw

GB10_FUNCTION_FLOOR, GB10_CABLE_FLOOR = 80.0, 150.0
TWINS = [
    {
        "interface": "enp1s0f1np1",
        "address": "198.18.1.1",
        "rdma_device": "rocep1s0f1",
        "rdma_port": 1,
        "gid_index": 3,
    },
    {
        "interface": "enP2p1s0f1np1",
        "address": None,
        "rdma_device": "roceP2p1s0f1",
        "rdma_port": 1,
        "gid_index": "auto",
    },
]


def _port(rank: int, twins: list[dict[str, Any]] = TWINS) -> dict[str, Any]:
    """Cable spark1-spark2 (cage 1 on both ends) from rank 1 (serves) or rank 2 (connects)."""
    me, peer = (1, 2) if rank == 1 else (2, 1)
    return {
        "cage": 1,
        "interface": twins[0]["interface"],
        "edge": "spark1-spark2",
        "address": f"198.18.1.{me}",
        "prefix": 24,
        "twins": twins,
        "peer_rank": peer,
        "peer_host": f"spark{peer}",
        "peer_address": f"198.18.1.{peer}",
        "peer_cage": 1,
    }


def ib_write_bw_output(gbit: float, warning: bool = True) -> str:
    warn = (
        " Conflicting CPU frequency values detected: 1500.000000 != 3300.016000. CPU Frequency is not max.\n"
    )
    return (
        "---------------------------------------------------------------------------------------\n"
        "                    RDMA_Write BW Test\n"
        " Dual-port       : OFF\t\tDevice         : rocep1s0f1\n"
        " Link type       : Ethernet\n"
        " GID index       : 3\n"
        "---------------------------------------------------------------------------------------\n"
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        + (warn if warning else "")
        + f" 65536      560845           0.00               {gbit:.2f}                0.186950\n"
        "---------------------------------------------------------------------------------------\n"
    )


class Node:
    """The commands the module runs on one end: ib_write_bw answered per (device, TCP port)."""

    def __init__(self, figures: dict[tuple[str, int], float], refusals: int = 0) -> None:
        self.figures = figures
        self.refusals = refusals  # connection attempts refused before the other end listens
        self.ran: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, argv: list[str], data: str | None = None) -> tuple[int, str, str]:
        with self.lock:
            self.ran.append(argv)
            if self.refusals:
                self.refusals -= 1
                return (
                    1,
                    "",
                    " Couldn't connect to 198.18.1.1:18760\nUnable to open file descriptor for socket connection",
                )
        tool = argv.index("/usr/bin/ib_write_bw")
        device, tcp_port = argv[argv.index("-d", tool) + 1], int(argv[argv.index("-p", tool) + 1])
        serving = argv[-1] == "--report_gbits"
        return 0, "" if serving else ib_write_bw_output(self.figures[(device, tcp_port)]), ""


def _which(missing: tuple[str, ...] = ()):
    def which(name: str, required: bool = True) -> str | None:
        return None if name in missing else f"/usr/bin/{name}"

    return which


def _qualifier(
    cable_module,
    rank: int,
    run,
    *,
    fabric: str = "verbs",
    floors=(GB10_FUNCTION_FLOOR, GB10_CABLE_FLOOR),
    twins=TWINS,
    missing=(),
    frames=None,
):
    params = {
        "rank": rank,
        "port": _port(rank, twins),
        "fabric": fabric,
        "min_function_gbit_s": floors[0],
        "min_cable_gbit_s": floors[1],
        "bulk": {
            "tool": "ib_write_bw",
            "size_bytes": 65536,
            "duration_s": 3,
            "tcp_port": 18760,
            "timeout_s": 5,
        },
    }
    q = cable_module.CableQualifier(params, run, _which(missing), check_mode=False, sysfs="/nonexistent")
    q.measurements["gid_indices"] = {t["interface"]: 3 if t["address"] else 1 for t in twins}
    q.measurements["frames"] = frames or []
    return q


def _by_key(q) -> dict[str, Any]:
    return {
        f"{c.id}@{c.subject.rsplit('(', 1)[-1].rstrip(')')}" if c.subject.endswith(")") else c.id: c
        for c in q.checks
    }


# ---- ib_write_bw: the command, its output, its stages -------------------------------------


@pytest.mark.parametrize("warning", [True, False])
def test_the_average_is_read_from_the_result_table(warning):
    assert rdma_bw.parse_ib_write_bw(ib_write_bw_output(94.02, warning)) == 94.02


def test_a_short_header_row_still_names_the_column():
    out = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]\n 1048576    5000     92.62   91.50   0.011\n"
    assert rdma_bw.parse_ib_write_bw(out) == 91.50


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (
            " #bytes  #iterations  BW peak[MB/sec]  BW average[MB/sec]  MsgRate[Mpps]\n 65536  5000  11000.1  11000.0  0.17\n",
            "reported BW average[MB/sec], expected Gb/sec",
        ),
        (" Couldn't connect to 198.18.1.1:18760\n", "printed no result table: Couldn't connect"),
        ("", "printed no result table: no output"),
    ],
)
def test_anything_but_a_gbit_table_is_an_error(out, message):
    with pytest.raises(rdma_bw.BandwidthError, match=re.escape(message)):
        rdma_bw.parse_ib_write_bw(out)


def test_argv_serves_or_connects_bounded_by_timeout():
    serve = rdma_bw.ib_write_bw_argv("ib_write_bw", "roceP2p1s0f1", 1, 1, 18763, 65536, 3)
    assert serve == [
        "ib_write_bw",
        "-d",
        "roceP2p1s0f1",
        "-i",
        "1",
        "-x",
        "1",
        "-p",
        "18763",
        "-s",
        "65536",
        "-D",
        "3",
        "-F",
        "--report_gbits",
    ]
    connect = rdma_bw.ib_write_bw_argv(
        "ib_write_bw",
        "rocep1s0f1",
        1,
        3,
        18760,
        65536,
        3,
        server="198.18.1.1",
        timeout_bin="timeout",
        timeout_s=30,
    )
    assert connect[:3] == ["timeout", "--kill-after=5", "30"] and connect[-1] == "198.18.1.1"


def test_every_twin_alone_then_all_at_once_each_on_its_own_port():
    assert rdma_bw.stages(2) == [[0], [1], [0, 1]]
    assert rdma_bw.stages(1) == [[0]]
    ports = [rdma_bw.stage_port(18760, s, t, 2) for s, group in enumerate(rdma_bw.stages(2)) for t in group]
    assert ports == [18760, 18763, 18764, 18765] and len(set(ports)) == len(ports)


def test_the_connecting_side_waits_for_the_server_then_gives_up_at_the_deadline():
    node = Node({("rocep1s0f1", 18760): 96.3}, refusals=2)
    argv = rdma_bw.ib_write_bw_argv(
        "/usr/bin/ib_write_bw", "rocep1s0f1", 1, 3, 18760, 65536, 3, server="198.18.1.1"
    )
    assert rdma_bw.connect(node, argv, time.monotonic() + 5, retry_s=0.01) == 96.3
    assert len(node.ran) == 3
    never = Node({}, refusals=10**6)
    with pytest.raises(rdma_bw.BandwidthError, match="ib_write_bw exit 1: Couldn't connect"):
        rdma_bw.connect(never, argv, time.monotonic() + 0.05, retry_s=0.01)


def test_a_server_that_times_out_says_so():
    def run(argv):
        return 124, "", "waiting for client"

    with pytest.raises(rdma_bw.BandwidthError, match=r"exit 124 \(timed out\)"):
        rdma_bw.serve(run, ["timeout", "30", "ib_write_bw"])


# ---- the floors on verbs (GB10 defaults) ----------------------------------------------------

HEALTHY = {
    ("rocep1s0f1", 18760): 98.1,
    ("roceP2p1s0f1", 18763): 96.4,
    ("rocep1s0f1", 18764): 95.2,
    ("roceP2p1s0f1", 18765): 94.9,
}


def test_a_healthy_cable_passes_every_floor_with_its_figures(cable_module):
    node = Node(HEALTHY)
    q = _qualifier(cable_module, 2, node)
    q._bulk()
    checks = _by_key(q)
    assert {k: c.status for k, c in checks.items()} == {
        "CQ-BW-FUNCTION@enp1s0f1np1": "pass",
        "CQ-BW-FUNCTION@enP2p1s0f1np1": "pass",
        "CQ-BW-CABLE": "pass",
    }
    assert checks["CQ-BW-CABLE"].detail == (
        "cable r2 cage1 <-> r1 cage1: 190.1 Gb/s with every function at once (ib_write_bw 65536 B for 3 s); "
        "per function enp1s0f1np1 98.1, enP2p1s0f1np1 96.4; floor 150 Gb/s"
    )
    assert q.measurements["bulk"]["cable_gbit_s"] == 190.1
    # Connected to the serving end's port address, each twin with its own GID index and port.
    first = node.ran[0]
    assert first[:3] == ["/usr/bin/timeout", "--kill-after=5", "5"] and first[-1] == "198.18.1.1"
    assert [(a[a.index("-d") + 1], a[a.index("-x") + 1], a[a.index("-p") + 1]) for a in node.ran][:2] == [
        ("rocep1s0f1", "3", "18760"),
        ("roceP2p1s0f1", "1", "18763"),
    ]
    assert len(node.ran) == 4


def test_the_fields_degraded_cable_fails_naming_the_cable_the_figure_and_the_fix(cable_module):
    """~118 Gb/s with both functions at once (the field's degraded cable): the second function is
    the slow one (as a Gen5 x2 link leaves it)."""
    q = _qualifier(
        cable_module,
        2,
        Node(
            {
                ("rocep1s0f1", 18760): 97.6,
                ("roceP2p1s0f1", 18763): 51.3,
                ("rocep1s0f1", 18764): 68.9,
                ("roceP2p1s0f1", 18765): 49.2,
            }
        ),
    )
    q._bulk()
    checks = _by_key(q)
    assert checks["CQ-BW-FUNCTION@enp1s0f1np1"].status == "pass"
    slow = checks["CQ-BW-FUNCTION@enP2p1s0f1np1"]
    assert slow.status == "fail" and slow.domain == "performance"
    assert slow.detail == (
        "cable r2 cage1 <-> r1 cage1: enP2p1s0f1np1 (roceP2p1s0f1) alone: 51.3 Gb/s (ib_write_bw 65536 B for 3 s), "
        "under the function floor 80 Gb/s"
    )
    cable = checks["CQ-BW-CABLE"]
    assert cable.status == "fail"
    assert cable.detail.startswith("cable r2 cage1 <-> r1 cage1: 118.1 Gb/s with every function at once")
    assert cable.detail.endswith("; under its floor 150 Gb/s")
    for words in (
        "reseat or replace the cable r2 cage1 <-> r1 cage1",
        "lists both twins of cage 1",
        "PF-PCIE",
        "Gen5 x2",
    ):
        assert words in cable.fix
    verdict = cable_module.verdict(q.checks)
    assert (verdict["status"], verdict["failure_domain"]) == ("failed", "performance")


def test_a_cable_on_one_listed_twin_fails_the_cable_floor(cable_module):
    """Only one twin listed (the field's other half-bandwidth case): one healthy function is not a cable."""
    q = _qualifier(cable_module, 2, Node({("rocep1s0f1", 18760): 104.7}), twins=TWINS[:1])
    q._bulk()
    checks = _by_key(q)
    assert checks["CQ-BW-FUNCTION@enp1s0f1np1"].status == "pass"
    assert checks["CQ-BW-CABLE"].status == "fail" and "104.7 Gb/s" in checks["CQ-BW-CABLE"].detail


def test_only_the_function_floor_set_still_reports_the_cable(cable_module):
    q = _qualifier(cable_module, 2, Node(HEALTHY), floors=(GB10_FUNCTION_FLOOR, None))
    q._bulk()
    assert _by_key(q)["CQ-BW-CABLE"].detail.endswith("; no cable floor set")


def test_the_serving_end_serves_and_leaves_the_verdict_to_the_connecting_end(cable_module):
    node = Node(HEALTHY)
    q = _qualifier(cable_module, 1, node)
    q._bulk()
    (check,) = q.checks
    assert (check.id, check.status) == ("CQ-BW-CABLE", "skip")
    assert check.detail == "measured and judged at r2, where ib_write_bw connects from; this end served"
    assert all(argv[-1] == "--report_gbits" for argv in node.ran) and len(node.ran) == 4


def test_a_failed_measurement_fails_closed(cable_module):
    q = _qualifier(cable_module, 2, Node({}, refusals=10**6))
    q.p["bulk"]["timeout_s"] = 0.2
    q._bulk()
    (check,) = q.checks
    assert (check.id, check.status) == ("CQ-BW-CABLE", "fail")
    assert "could not be measured: ib_write_bw exit 1: Couldn't connect" in check.detail
    assert "see r1's CQ-BW-CABLE" in check.fix


def test_without_perftest_the_floors_fail_closed_saying_how_to_install_it(cable_module):
    node = Node(HEALTHY)
    q = _qualifier(cable_module, 2, node, missing=("ib_write_bw",))
    q._bulk()
    (check,) = q.checks
    assert check.status == "fail" and "ib_write_bw (perftest) is not installed on r2" in check.detail
    assert "apt-get install perftest" in check.fix and not node.ran


def test_no_floor_runs_nothing_and_says_only_the_ring_comparison_judges(cable_module):
    node = Node(HEALTHY)
    q = _qualifier(cable_module, 2, node, floors=(None, None))
    q._bulk()
    (check,) = q.checks
    assert check.status == "skip" and "only the ring-relative comparison" in check.detail and not node.ran


def test_an_earlier_failure_skips_the_measurement(cable_module):
    node = Node(HEALTHY)
    q = _qualifier(cable_module, 2, node)
    q.checks.append(cable_module.Check("CQ-COUNTERS", "fail", "errors", "x", "rx_crc_errors +7", "fix"))
    q._bulk()
    assert q.checks[-1].detail == "not run: CQ-COUNTERS failed first" and not node.ran


# ---- the floor on tcp (the sim): the probe's slowest direction ------------------------------

FRAMES = [
    {"size_bytes": 12288, "tx_gbit_s": 0.4217, "rx_gbit_s": 0.51},
    {"size_bytes": 16384, "tx_gbit_s": 1.47, "rx_gbit_s": 1.2},
]


@pytest.mark.parametrize(
    ("floor", "status"),
    [(0.005, "pass"), (0.4217, "pass"), (0.5, "fail")],
)
def test_tcp_judges_the_probes_slowest_direction(cable_module, floor, status):
    q = _qualifier(cable_module, 2, None, fabric="tcp", floors=(None, floor), frames=FRAMES)
    q._bulk()
    (check,) = q.checks
    assert (check.id, check.status) == ("CQ-BW-CABLE", status)
    assert check.detail.startswith(
        "cable r2 cage1 <-> r1 cage1: 0.422 Gb/s with every function at once (the probe"
    )


def test_tcp_has_no_per_function_figure(cable_module):
    q = _qualifier(cable_module, 2, None, fabric="tcp", floors=(GB10_FUNCTION_FLOOR, 0.005), frames=FRAMES)
    q._bulk()
    function, cable = q.checks
    assert (function.id, function.status) == ("CQ-BW-FUNCTION", "skip")
    assert "per-function floors apply on verbs" in function.detail and cable.status == "pass"


def test_the_sim_floor_sits_under_the_shaped_link(cable_module):
    """The sim's floor (inventories/sim) must pass the 20 Mbit/s tbf cable of tests/sim/cable (the
    relative check warns on it) and every unshaped cable: it is far under both."""
    root = Path(__file__).resolve().parents[3]
    floors = yaml.safe_load((root / "inventories/sim/group_vars/sparkring/qualify.yml").read_text())
    floor = floors["qualify_min_cable_gbit_s"]
    assert floors["qualify_min_function_gbit_s"] is None
    shaped_gbit = 20e6 / 1e9
    assert floor <= shaped_gbit / 3, (
        "the shaped cable must clear the floor with margin (probe overhead, load)"
    )
    assert (root / "inventories/sim-pair/group_vars/all/qualify.yml").resolve() == (
        root / "inventories/sim/group_vars/sparkring/qualify.yml"
    ).resolve()
