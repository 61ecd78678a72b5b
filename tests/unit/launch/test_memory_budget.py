"""The memory budget (sparkring.memory_budget): each term, the sim's shared host, the example ring.

The figures are docs/launch.md's ("Memory budget"); GB10's MemTotal here is the 124,546 MiB a
DGX Spark reports (AEON-7/vllm-ultimate-dgx-spark#9), the sim machine's the 24 GiB LABS.md names."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sparkring.lock import load_lock
from sparkring.memory_budget import (
    BudgetError,
    NodeMemory,
    budget_report,
    host_budgets,
    parse_node_memory,
    rank_terms,
    weight_bytes,
)
from sparkring.models import model_pins
from sparkring.profile import GIB, load_profile, load_profile_file, parse_env_file

from sparkcache.store import PAGE_BUFFER_BYTES, READ_AHEAD_BYTES

ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "inventories" / "sim" / "launch.env"
RING4 = ROOT / "inventories" / "example" / "ring4" / "launch.env"
GB10_MEMTOTAL = 124_546 * 1024**2
SIM_MEMTOTAL = 24 * GIB


def sim_profile(**overrides: str):
    return load_profile(parse_env_file(SIM.read_text()) | overrides).for_world(4)


def sim_pins() -> list[dict]:
    return model_pins(load_profile_file(SIM), load_lock(), "sim-target", "")


def pin(role: str, name: str, files: dict[str, int]) -> dict:
    return {
        "role": role,
        "name": name,
        "files": [{"path": p, "size": s, "sha256": "0" * 64} for p, s in files.items()],
    }


def one_host(count: int, memtotal: int = SIM_MEMTOTAL) -> list[NodeMemory]:
    return [NodeMemory(rank=r, host=f"r{r}", memtotal=memtotal, boot_id="one-kernel") for r in range(count)]


def own_hosts(count: int, memtotal: int = GB10_MEMTOTAL) -> list[NodeMemory]:
    return [
        NodeMemory(rank=r, host=f"spark{r}", memtotal=memtotal, boot_id=f"boot-{r}") for r in range(count)
    ]


def terms(profile, runtime="gb10", pins=()) -> dict[str, int]:
    return {t.name: t.nbytes for t in rank_terms(profile, runtime, list(pins))}


# ---------------------------------------------------------------- each term


def test_weight_files_are_the_top_level_safetensors_else_pytorch_files():
    files = pin(
        "target", "m", {"a.safetensors": 10, "b.safetensors": 5, "c.bin": 99, "original/x.safetensors": 7}
    )
    assert weight_bytes(files["files"]) == 15
    files = pin("target", "m", {"pytorch_model.bin": 8, "extra.pt": 2, "tokenizer.json": 50})
    assert weight_bytes(files["files"]) == 10


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_weights_are_sharded_by_tp_and_not_by_dcp(dcp):
    profile = sim_profile(DCP=str(dcp))
    target = pin("target", "m", {"model-1.safetensors": 3 * GIB, "model-2.safetensors": 2 * GIB + 1})
    assert terms(profile, pins=[target])["weights"] == math.ceil((5 * GIB + 1) / 4)


def test_the_sim_model_weights_come_from_its_pinned_manifest():
    (target,) = sim_pins()
    size = next(f["size"] for f in target["files"] if f["path"] == "model.safetensors")
    assert terms(sim_profile(), "sim-cpu", sim_pins())["weights"] == math.ceil(size / 4)


@pytest.mark.parametrize(("dcp", "gib"), [(1, 26), (2, 30), (4, 30)])
def test_the_kv_cache_is_the_geometry_default_unless_set(dcp, gib):
    profile = load_profile(parse_env_file(RING4.read_text()) | {"DCP": str(dcp)}).for_world(4)
    assert terms(profile)["KV cache"] == gib * GIB
    assert terms(sim_profile())["KV cache"] == 1 * GIB  # the sim's KV_CACHE_GIB=1


def test_vllm_overhead_is_the_runtime_figure():
    assert terms(sim_profile(), "gb10")["vLLM"] == 6 * GIB
    assert terms(sim_profile(), "sim-cpu")["vLLM"] == round(2.35 * GIB)


def test_the_draft_counts_only_when_vllm_loads_it():
    draft = pin("draft", "d", {"model.safetensors": 8 * GIB})
    target = pin("target", "m", {"model.safetensors": GIB})
    paths = {"DRAFT_PATH": "/srv/models/draft", "DRAFT_REVISION": "d1"}
    assert terms(sim_profile(**paths, SPEC_METHOD="draft_model"), pins=[target, draft])["draft"] == 2 * GIB
    assert terms(sim_profile(**paths, SPEC_METHOD="mtp"), pins=[target, draft])["draft"] == 0


def test_sparkcache_staging_is_its_bounded_restore_buffers_when_on():
    assert terms(sim_profile())["SparkCache staging"] == READ_AHEAD_BYTES + PAGE_BUFFER_BYTES
    assert terms(sim_profile(SPARKCACHE_ENABLED="0"))["SparkCache staging"] == 0


def test_the_reserve_is_counted_once_per_host():
    (shared,) = host_budgets(sim_profile(), "sim-cpu", sim_pins(), one_host(4))
    assert shared.reserve.nbytes == math.ceil(SIM_MEMTOTAL * 0.08)
    assert shared.need == 4 * shared.per_rank + shared.reserve.nbytes
    separate = host_budgets(sim_profile(), "sim-cpu", sim_pins(), own_hosts(4, SIM_MEMTOTAL))
    assert [b.need for b in separate] == [shared.per_rank + shared.reserve.nbytes] * 4


def test_memory_facts_are_read_from_meminfo_and_the_boot_id():
    text = Path("/proc/meminfo").read_text() + Path("/proc/sys/kernel/random/boot_id").read_text()
    node = parse_node_memory(2, "r2", text)
    kib = next(int(line.split()[1]) for line in text.splitlines() if line.startswith("MemTotal:"))
    assert node.memtotal == kib * 1024
    assert node.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with pytest.raises(BudgetError, match=r"rank 2 \(r2\): no MemTotal or boot id"):
        parse_node_memory(2, "r2", "MemFree: 1 kB\n")


# ---------------------------------------------------------------- the sim


def test_the_sim_profile_fits_the_sim_machine():
    report = budget_report(load_profile_file(SIM), "sim-cpu", sim_pins(), one_host(4), 4)
    assert report["fits"] and report["complete"] and report["refusals"] == []
    assert [c["status"] for c in report["checks"].values()] == ["pass"] * 4
    assert report["lines"][1].startswith("r0 (r0), r1 (r1), r2 (r2), r3 (r3) share one host: 4 ranks x (")


def test_a_too_large_profile_on_the_sim_is_refused_naming_every_term():
    profile = load_profile(parse_env_file(SIM.read_text()) | {"KV_CACHE_GIB": "8"})
    report = budget_report(profile, "sim-cpu", sim_pins(), one_host(4), 4)
    assert not report["fits"]
    (refusal,) = report["refusals"]
    for term in (
        "weights 0.00 GiB (sim-target: 2,233,000 B of weight files / TP 4)",
        "KV cache 8.00 GiB (KV_CACHE_GIB=8)",
        "vLLM 2.35 GiB",
        "draft 0.00 GiB (SPEC_METHOD=none loads no draft model)",
        "SparkCache staging 0.31 GiB",
        "per rank 10.66 GiB x 4 ranks on this host",
        "OS and page-cache reserve 1.92 GiB (8% of MemTotal, once per host)",
        "needs 44.57 GiB, MemTotal is 24.00 GiB (20.57 GiB short)",
    ):
        assert term in refusal, (term, refusal)
    fix = refusal.partition("Fix: ")[2]
    assert "lower KV_CACHE_GIB to 2 or less (now 8)" in fix
    assert "MAX_MODEL_LEN" in fix and "another quantization" in fix and "more ranks" in fix
    assert all(c["status"] == "fail" and c["fix"] == fix for c in report["checks"].values())


def test_only_the_ranks_with_memory_facts_are_budgeted():
    """An unreachable rank (PF-SSH failed) has no facts: its report holds no budget check."""
    report = budget_report(load_profile_file(SIM), "sim-cpu", sim_pins(), one_host(3), 4)
    assert sorted(report["checks"]) == ["0", "1", "2"]
    assert report["lines"][1].startswith("r0 (r0), r1 (r1), r2 (r2) share one host: 3 ranks x (")


# ---------------------------------------------------------------- GB10


def test_the_example_ring4_budget_is_printed_per_rank():
    report = budget_report(load_profile_file(RING4), "gb10", [], own_hosts(4), 4)
    assert report["lines"] == [
        "per rank: weights 0.00 GiB (no model pinned: the inventory names no model_target); "
        "KV cache 30.00 GiB (KV_CACHE_GIB default for DCP=4); "
        "vLLM 6.00 GiB (activations, CUDA graphs, sampler, processes on gb10); "
        "draft 0.00 GiB (SPEC_METHOD=mtp loads no draft model); "
        "SparkCache staging 0.31 GiB (restore read-ahead and page buffers)",
        *(
            f"r{r} (spark{r}): weights 0.00 + KV cache 30.00 + vLLM 6.00 + draft 0.00 + SparkCache staging 0.31 "
            "+ OS and page-cache reserve 9.73 = 46.04 GiB of MemTotal 121.63 GiB: fits, 75.58 GiB spare "
            "(weights not counted)"
            for r in range(4)
        ),
    ]
    assert not report["complete"]


def test_the_reference_deployment_fits_and_its_checkpoint_with_dcp4_kv_does_not():
    """Reference 004 served the 382 GiB GLM-5.2 checkpoint over four GB10s with 4 GB of KV per rank."""
    glm52 = [pin("target", "glm-5.2", {f"model-{i:05d}.safetensors": 382 * GIB // 80 for i in range(80)})]
    values = parse_env_file(RING4.read_text()) | {"KV_CACHE_GIB": "4"}
    report = budget_report(load_profile(values), "gb10", glm52, own_hosts(4), 4)
    assert report["fits"], report["lines"]
    report = budget_report(load_profile(values | {"KV_CACHE_GIB": "30"}), "gb10", glm52, own_hosts(4), 4)
    assert len(report["refusals"]) == 4
    assert "lower KV_CACHE_GIB to 10 or less (now 30)" in report["refusals"][0]
