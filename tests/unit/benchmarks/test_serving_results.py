"""The serving results are one interleaved run against the best stock: the keys issue 18 asks for,
the figures recomputable from the rounds they list, every round's load with the rounds above the
core count counted in the headline, and for every deployment what carried its collectives.

Each check runs on the committed results (benchmarks/results/serving.json) and on a dry run of
bench.py's own command line (argument parsing, the plan, a run continued across two bounded calls,
the summary, the results file, its plot and history) in which a stand-in target answers each
deployment's completions instead of vLLM: that part needs the sim ring and the sim lock, and the
committed file is its record."""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

from benchmarks.history import load_runs
from benchmarks.serving import bench
from benchmarks.serving.runs import Variant, deployments_log
from benchmarks.serving.sim_network import management_routes

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "benchmarks" / "results" / "serving.json"
HOSTVARS = cluster_hostvars(load_cluster_file(ROOT / "inventories" / "sim" / "cluster.yml"))
# Stand-in decode and prefill rates per variant (tok/s): the dry run checks the arithmetic, not them.
RATES = {"stock-management": (10.0, 4000.0), "stock-ring": (12.0, 3000.0), "overlay": (30.0, 5000.0)}


class StandInTarget:
    """Answers each deployment's completions at RATES through bench.measure_rounds (no vLLM); a
    deployment of the variant named `fail` raises, as a failed launch does."""

    def __init__(self, fail: str | None = None) -> None:
        self.deployed: list[str] = []
        self.fail = fail
        self.setup = {"tp": 4, "nodes": "stand-in: no deployment", "model": "none", "client": "none"}

    def deploy(self, index: int, variant: Variant, decode_tokens: int, rounds: int) -> dict:
        self.deployed.append(variant.name)
        if variant.name == self.fail:
            raise RuntimeError(f"launch ({variant.name}) failed")
        decode, prefill = RATES[variant.name]

        def complete(prompt: str, max_tokens: int) -> dict[str, float]:
            prompt_tokens = len(prompt.split())
            ttft = prompt_tokens / prefill
            return {
                "ttft_s": ttft,
                "total_s": ttft + (max_tokens - 1) / decode,
                "completion_tokens": max_tokens,
                "prompt_tokens": prompt_tokens,
            }

        return {
            "launch_s": 0.0,
            "rounds": bench.measure_rounds(complete, decode_tokens, rounds),
            "carried_by": {},
        }


def run_bench(patch: pytest.MonkeyPatch, out: Path, target: StandInTarget, deployments: str) -> int:
    """bench.main as `--target sim --out <out> --deployments N`, with the stand-in as its target."""

    @contextlib.contextmanager
    def stand_in(args, workdir) -> Iterator[StandInTarget]:
        assert args.target == "sim" and args.per_side == 3
        yield target

    patch.setattr(bench, "target_for", stand_in)
    argv = [
        "bench",
        "--target",
        "sim",
        "--decode-tokens",
        "16",
        "--out",
        str(out),
        "--deployments",
        deployments,
    ]
    patch.setattr(sys, "argv", argv)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return bench.main()
    finally:
        signal.signal(signal.SIGTERM, handler)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, list[list[str]]]:
    """Two calls of bench.main: 5 deployments, then the 7 left."""
    out = tmp_path_factory.mktemp("serving") / "serving.json"
    calls: list[list[str]] = []
    with pytest.MonkeyPatch.context() as patch:
        for chunk in ("5", "0"):
            target = StandInTarget()
            assert run_bench(patch, out, target, chunk) == 0
            calls.append(target.deployed)
    return json.loads(out.read_text()), out, calls


@pytest.fixture(params=["committed", "dry-run"])
def results(request: pytest.FixtureRequest) -> dict:
    if request.param == "committed":
        return json.loads(COMMITTED.read_text())
    return request.getfixturevalue("dry_run")[0]


def sides(doc: dict) -> list[dict]:
    return [*doc["stock_variants"].values(), doc["overlay"]]


def test_the_run_alternates_stock_and_overlay_with_three_deployments_per_stock_variant(results: dict) -> None:
    assert results["schema"] == "sparkring.benchmark.serving/2" and results["rounds_interleaved"] is True
    assert results["deployment_order"] == ["stock-management", "overlay", "stock-ring", "overlay"] * 3
    assert set(results["stock_variants"]) == {"stock-management", "stock-ring"}
    rounds = results["setup"]["rounds_per_deployment"]
    for side in sides(results):
        assert len(side["deployments"]) >= 3
        assert [d["index"] for d in side["deployments"]] == sorted(d["index"] for d in side["deployments"])
        for key in (
            "decode_tok_s_rounds",
            "prefill_tok_s_rounds",
            "load_avg_1m_rounds",
            "over_core_count_rounds",
        ):
            assert len(side[key]) == rounds * len(side["deployments"]), key


@pytest.mark.parametrize(
    ("metric", "ratio"),
    [("decode", "decode_ratio_vs_best_stock"), ("prefill", "prefill_ratio_vs_best_stock")],
)
def test_each_ratio_is_the_overlay_median_over_the_faster_stock_variant(
    results: dict, metric: str, ratio: str
) -> None:
    rounds = f"{metric}_tok_s_rounds"
    medians = {name: statistics.median(side[rounds]) for name, side in results["stock_variants"].items()}
    best = max(medians, key=medians.get)
    assert results["best_stock"][metric] == best
    assert results[ratio] == pytest.approx(statistics.median(results["overlay"][rounds]) / medians[best])
    assert f"{metric} {results[ratio]:.2f}x" in results["headline"]


def test_rounds_above_the_core_count_are_marked_counted_and_in_the_headline(results: dict) -> None:
    cores = results["provenance"]["cpu_cores"]
    for side in sides(results):
        assert side["over_core_count_rounds"] == [load > cores for load in side["load_avg_1m_rounds"]]
    loads = [load for side in sides(results) for load in side["load_avg_1m_rounds"]]
    over = results["rounds_over_core_count"]
    assert over == {"rounds": sum(load > cores for load in loads), "of": len(loads), "cores": cores}
    assert f"{over['rounds']} of {over['of']} rounds" in results["headline"]


def test_the_results_name_their_provenance_and_every_call_of_the_run(results: dict) -> None:
    provenance = results["provenance"]
    assert {
        "command",
        "git_commit",
        "git_dirty",
        "cpu_cores",
        "started_utc",
        "load_avg_start",
        "finished_utc",
        "load_avg_end",
    } <= set(provenance)
    assert " --target sim" in provenance["command"]
    assert len(provenance["git_commit"]) == 40
    assert results["calls"] and all(
        call["git_commit"] == provenance["git_commit"] for call in results["calls"]
    )


def test_the_committed_run_was_measured_by_the_module_on_a_committed_tree() -> None:
    provenance = json.loads(COMMITTED.read_text())["provenance"]
    assert "-m benchmarks.serving.bench --target sim" in provenance["command"]
    assert provenance["git_dirty"] is False


def test_every_committed_deployment_records_what_carried_its_collectives() -> None:
    doc = json.loads(COMMITTED.read_text())
    head = HOSTVARS["r0"]["sparkring_management"]["address"].split("/")[0]
    over_ring = {
        host: next(r["dev"] for r in routes if r["to"].split("/")[0] == head)
        for host, routes in management_routes(HOSTVARS).items()
        if host != "r0"
    }
    for name, side in doc["stock_variants"].items():
        path = "ring" if name == "stock-ring" else "management"
        for deployment in side["deployments"]:
            carried = deployment["carried_by"]
            assert set(carried["vllm_backend_log"]) == set(HOSTVARS)
            assert all(
                any("backend=gloo" in line for line in lines)
                for lines in carried["vllm_backend_log"].values()
            )
            assert all(
                env["SPARKRING_OVERLAY_MODE"] == "disabled" for env in carried["container_env"].values()
            )
            assert carried["dominant_path_ranks_1_to_3"] == path
            expected = (
                over_ring
                if path == "ring"
                else {h: HOSTVARS[h]["sparkring_management"]["interface"] for h in over_ring}
            )
            assert carried["route_to_head_device"] == expected
    for deployment in doc["overlay"]["deployments"]:
        carried = deployment["carried_by"]
        assert all(env["SPARKRING_OVERLAY_MODE"] == "custom" for env in carried["container_env"].values())
        recorders = carried["flight_recorder"]
        assert set(recorders) == set(HOSTVARS) and {r["mode"] for r in recorders.values()} == {"custom"}
        per_rank = carried["ring_all_reduces_per_rank"]
        assert len(per_rank) == 4 and min(per_rank.values()) > 0
        assert {str(r["rank"]): r["counters"]["all_reduce.ring"] for r in recorders.values()} == per_rank


def test_the_committed_run_is_the_last_line_of_the_history_after_the_older_run() -> None:
    doc = json.loads(COMMITTED.read_text())
    history = load_runs(ROOT / doc["history"])
    assert history[-1] == doc
    assert "seeded_from" in history[0] and history[0]["decode_ratio_vs_stock"] == pytest.approx(
        3.3724, abs=1e-4
    )
    logged = [r for r in load_runs(ROOT / doc["deployments_log"]) if r["run_id"] == doc["run_id"]]
    assert sorted(r["index"] for r in logged) == list(range(len(doc["deployment_order"])))


def test_a_dry_run_continues_across_calls_and_writes_the_plot_and_the_history(dry_run) -> None:
    doc, out, calls = dry_run
    assert calls == [doc["deployment_order"][:5], doc["deployment_order"][5:]]
    assert len(doc["calls"]) == 2 and doc["run_id"] in out.with_name("serving-deployments.jsonl").read_text()
    assert len(load_runs(deployments_log(out))) == 12
    assert load_runs(out.with_name("serving-history.jsonl")) == [doc]
    assert out.with_suffix(".png").stat().st_size > 0
    assert doc["best_stock"] == {"decode": "stock-ring", "prefill": "stock-management"}


def test_a_failed_deployment_is_logged_and_the_next_call_starts_a_new_run(
    tmp_path: Path, monkeypatch
) -> None:
    out = tmp_path / "serving.json"
    with pytest.raises(RuntimeError, match=r"launch \(stock-ring\) failed"):
        run_bench(monkeypatch, out, StandInTarget(fail="stock-ring"), "0")
    first = load_runs(deployments_log(out))
    assert [(r["variant"], r.get("failed")) for r in first] == [
        ("stock-management", None),
        ("overlay", None),
        ("stock-ring", "RuntimeError: launch (stock-ring) failed"),
    ]
    assert "call" in first[2] and "rounds" not in first[2]
    assert run_bench(monkeypatch, out, StandInTarget(), "1") == 0
    again = load_runs(deployments_log(out))[3]
    assert again["index"] == 0 and again["run_id"] != first[0]["run_id"] and not out.exists()
