"""The Soft-RoCE lane as tests: real verbs between QEMU TCG guests (tests/softroce/run.sh).

The host kernel has no RDMA, so this is the only place the verbs binding and the RC QP path meet
a real RDMA stack (Debian's kernel with rdma_rxe). The guests are cabled as the sim ring is
(four, or a pair with SOFTROCE_RANKS=2), every cable end a cage of two twins striped by the
verbs fabric. Booting software-emulated guests takes minutes, so the lane is opt-in: it runs
only when asked (SPARKRING_SOFTROCE=1, which `make softroce` sets after building the guest
image); otherwise every test here skips and says how to run it. One run of the guests serves
every test; each test checks one phase on every rank from the run's summary.json.
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
TIMEOUT = int(os.environ.get("SOFTROCE_TIMEOUT", "4500")) + 300

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
    "transport_burn",
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


def _ranks(summary: dict) -> range:
    return range(int(summary["world"]))


@pytest.mark.parametrize("phase", PHASES)
def test_phase_passes_on_every_guest(summary: dict, phase: str) -> None:
    records = {rank: _record(summary, rank, phase) for rank in _ranks(summary)}
    failed = {rank: r["detail"] for rank, r in records.items() if r["status"] == "fail"}
    assert not failed, f"{phase} failed: {failed} (logs: {OUT}/rank*/{phase}.log)"
    # perftest runs on cable 0 only (ranks 0 and 1): the other guests skip it, saying so.
    skipped = {rank: r["detail"] for rank, r in records.items() if r["status"] == "skip" and rank <= 1}
    if skipped:
        pytest.skip(f"{phase} skipped in the guests: {skipped}")
    assert {r["status"] for rank, r in records.items() if rank <= 1} == {"pass"}


def test_each_guest_saw_only_its_cables_twins(summary: dict) -> None:
    """The guests are on no network but their cables: one NIC per twin of each port, the first
    twin with the port address and its IPv4 RoCE v2 GID, the second with none and a link-local one."""
    ports = 1 if summary["world"] == 2 else 2
    for rank in _ranks(summary):
        net = _record(summary, rank, "net")["detail"]
        assert net.count(" mtu 9000 up") == 2 * ports and net.count("no-ipv4") == ports, net
        rxe = _record(summary, rank, "rxe")["detail"]
        assert rxe.count("RoCE v2 0000:0000:0000:0000:0000:ffff:c613:") == ports, rxe
        assert rxe.count("RoCE v2 fe80:") == ports, rxe


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


def test_verbs_links_are_striped_over_both_twins(summary: dict) -> None:
    """Each link's first twin used the IPv4-mapped GID of its port address, the second a link-local
    GID, both at path MTU 4096; the engine moved every frame and each twin's rxe device carried
    packets both ways (the striping)."""
    for rank in _ranks(summary):
        doc = _transport_json(summary, rank, "transport_verbs", "transport_verbs.json")
        for peer, twins in doc["links"].items():
            assert [t["twin"] for t in twins] == [0, 1], twins
            assert twins[0]["gid"].startswith("::ffff:c613:") and twins[1]["gid"].startswith("fe80::"), twins
            assert {t["path_mtu"] for t in twins} == {4096} and all(
                t["tx_qpn"] and t["rx_qpn"] for t in twins
            )
            stats = doc["stats"][peer]
            sent = sum(e["size_bytes"] for e in doc["exchanged"] if str(e["peer"]) == peer)
            assert stats["bytes_tx"] == stats["bytes_rx"] >= sent, stats
        moved = doc["rxe_packets"]
        assert len(moved) == 2 * len(doc["links"]) and all(
            m["sent_pkts"] and m["rcvd_pkts"] for m in moved.values()
        )


def test_probe_burn_and_allreduce_byte_exact(summary: dict) -> None:
    """The probe's payloads and burns, the burn gate, and every all-reduce matched the reference."""
    world = int(summary["world"])
    for rank in _ranks(summary):
        probe = _transport_json(summary, rank, "transport_probe", "probe.json")
        assert probe["ok"] and probe["fabric"] == "verbs", probe["error"]
        assert len(probe["links"]) == (1 if world == 2 else 2)
        assert [b["mismatches"] for b in probe["burns"]] == [0, 0], probe["burns"]
        burn = _transport_json(summary, rank, "transport_burn", "burn.json")
        assert burn["ok"] and burn["world"] == world and len(burn["burns"]) == 20, burn["error"]
        assert all(b["mismatches"] == 0 for b in burn["burns"]), burn["burns"]
        allreduce = _transport_json(summary, rank, "transport_allreduce", "transport_allreduce.json")
        assert allreduce["mismatches"] == 0 and len(allreduce["runs"]) == 16, allreduce
        cmdring = _transport_json(summary, rank, "transport_cmdring", "transport_cmdring.json")
        assert cmdring["mismatches"] == 0 and len(cmdring["runs"]) == 17, cmdring
        assert cmdring["progress_stats"]["all_reduce"] == 16 and cmdring["progress_stats"]["errors"] == 0
