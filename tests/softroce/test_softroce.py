"""The Soft-RoCE lane as tests: real verbs between two QEMU TCG guests (tests/softroce/run.sh).

The host kernel has no RDMA, so this is the only place the verbs binding and the RC QP path meet
a real RDMA stack (Debian's kernel with rdma_rxe). Booting two software-emulated guests takes
minutes, so the lane is opt-in: it runs only when asked (SPARKRING_SOFTROCE=1, which
`make softroce` sets after building the guest image); otherwise every test here skips and says
how to run it. One run of both guests serves every test; each test checks one phase on both
ranks from the run's summary.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.softroce

HERE = Path(__file__).resolve().parent
RUN = HERE / "run.sh"
CACHE = Path(os.environ.get("SOFTROCE_CACHE", "/var/cache/sparkring-softroce"))
OUT = Path(os.environ.get("SOFTROCE_OUT", str(CACHE / "run")))
# run.sh bounds the guests by SOFTROCE_TIMEOUT; this bounds staging and collection on top.
TIMEOUT = int(os.environ.get("SOFTROCE_TIMEOUT", "2400")) + 300

# Every guest phase, in the order guest-init.sh runs them. The transport_* phases skip (with
# the guest's reason) while transport/ is not in the checkout.
PHASES = [
    "net",
    "rxe",
    "ping",
    "rc_pingpong",
    "write_bw",
    "transport_build",
    "transport_verbs",
    "transport_probe",
    "transport_allreduce",
    "transport_cmdring",
]


def _why_not_runnable() -> str | None:
    if os.environ.get("SPARKRING_SOFTROCE") != "1":
        return "opt-in Soft-RoCE lane (QEMU TCG guests, minutes): run `make softroce`"
    if os.geteuid() != 0:
        return "the Soft-RoCE lane needs root (QEMU guests from a debootstrapped image)"
    if not shutil.which("qemu-system-x86_64"):
        return "qemu-system-x86_64 is missing: `tests/softroce/run.sh deps` (make softroce) installs it"
    if not (CACHE / "rootfs.img").is_file():
        return f"no guest image in {CACHE}: `tests/softroce/run.sh build` (make softroce) builds it"
    return None


@pytest.fixture(scope="module")
def summary() -> dict:
    """Boot both guests once, run every phase, return summary.json."""
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([str(RUN), "run"], timeout=TIMEOUT, check=False)
    summary_file = OUT / "summary.json"
    assert summary_file.is_file(), f"run.sh exited {proc.returncode} without {summary_file}"
    return json.loads(summary_file.read_text())


def _record(summary: dict, rank: int, phase: str) -> dict:
    records = [r for r in summary["ranks"][str(rank)] if r["phase"] == phase]
    assert records, f"rank {rank} never recorded phase {phase}: see {OUT}/console-{rank}.log"
    return records[0]


@pytest.mark.parametrize("phase", PHASES)
def test_phase_passes_on_both_guests(summary: dict, phase: str) -> None:
    records = {rank: _record(summary, rank, phase) for rank in (0, 1)}
    failed = {rank: r["detail"] for rank, r in records.items() if r["status"] == "fail"}
    assert not failed, f"{phase} failed: {failed} (logs: {OUT}/rank*/{phase}.log)"
    skipped = {rank: r["detail"] for rank, r in records.items() if r["status"] == "skip"}
    if skipped:
        pytest.skip(f"{phase} skipped in the guests: {skipped}")
    assert {r["status"] for r in records.values()} == {"pass"}


def test_each_guest_saw_only_its_cable(summary: dict) -> None:
    """The guests are on no network but the unix-socket cable: one NIC, the RoCE v2 GID on it."""
    for rank in (0, 1):
        net = _record(summary, rank, "net")["detail"]
        assert net.startswith("eth0 198.19.0.") and net.endswith(" up"), net
        assert "RoCE v2" in _record(summary, rank, "rxe")["detail"]


def test_perftest_moved_data(summary: dict) -> None:
    """ibv_rc_pingpong completed its 200 round trips and ib_write_bw reported a bandwidth."""
    assert "200 iters in" in _record(summary, 1, "rc_pingpong")["detail"]
    bw = _record(summary, 1, "write_bw")["detail"].split("BW average ")[-1].split()[0]
    assert float(bw) > 0, bw


def _transport_json(summary: dict, rank: int, phase: str, name: str) -> dict:
    record = _record(summary, rank, phase)
    if record["status"] == "skip":
        pytest.skip(f"{phase} skipped in the guests: {record['detail']}")
    return json.loads((OUT / f"rank{rank}" / name).read_text())


def test_verbs_links_came_up_as_roce_v2(summary: dict) -> None:
    """Each rank's RC QPs used the IPv4-mapped GID of its own address and the 4096 path MTU,
    and the engine moved the WRITE-with-immediate frames it was asked to."""
    for rank in (0, 1):
        doc = _transport_json(summary, rank, "transport_verbs", "transport_verbs.json")
        link = doc["links"][str(rank ^ 1)]
        assert link["gid"] == f"::ffff:c613:{rank + 1}", link  # 198.19.0.(rank+1)
        assert link["path_mtu"] == 4096 and link["tx_qpn"] and link["rx_qpn"], link
        stats = doc["stats"][str(rank ^ 1)]
        assert stats["bytes_tx"] == stats["bytes_rx"] >= sum(e["size_bytes"] for e in doc["exchanged"]), stats


def test_probe_and_allreduce_byte_exact(summary: dict) -> None:
    """The probe's payloads and burns, and every all-reduce, matched the reference on both ranks."""
    for rank in (0, 1):
        probe = _transport_json(summary, rank, "transport_probe", "probe.json")
        assert probe["ok"] and probe["fabric"] == "verbs", probe["error"]
        assert [b["mismatches"] for b in probe["burns"]] == [0, 0], probe["burns"]
        allreduce = _transport_json(summary, rank, "transport_allreduce", "transport_allreduce.json")
        assert allreduce["mismatches"] == 0 and len(allreduce["runs"]) == 16, allreduce
        cmdring = _transport_json(summary, rank, "transport_cmdring", "transport_cmdring.json")
        assert cmdring["mismatches"] == 0 and len(cmdring["runs"]) == 17, cmdring
        assert cmdring["progress_stats"]["all_reduce"] == 16 and cmdring["progress_stats"]["errors"] == 0
