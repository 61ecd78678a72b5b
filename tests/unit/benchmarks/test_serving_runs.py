"""The serving benchmark's plan and arithmetic: interleaved deployments, the best stock as the
baseline, rounds above the core count counted, runs continued across bounded calls; and the
routes that put stock's gloo traffic on the sim's ring links."""

from __future__ import annotations

from pathlib import Path

import pytest
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

from benchmarks.history import append_run
from benchmarks.serving import runs, sim_network

ROOT = Path(__file__).resolve().parents[3]

STOCK = runs.STOCK["sim"]


def test_deployments_alternate_stock_and_overlay_with_three_per_stock_variant() -> None:
    order = [v.name for v in runs.schedule(STOCK, 3)]
    assert order[0::2] == ["stock-management", "stock-ring"] * 3
    assert order[1::2] == ["overlay"] * 6


def deployment(index: int, variant: str, decode: list[float], prefill: list[float], load: float) -> dict:
    rounds = [
        {"decode_tok_s": d, "prefill_tok_s": p, "load_avg_before": {"1m": load}}
        for d, p in zip(decode, prefill, strict=True)
    ]
    return {
        "index": index,
        "variant": variant,
        "rounds": rounds,
        "started_utc": "t",
        "launch_s": 1,
        "carried_by": {},
    }


def test_each_ratio_is_against_the_faster_stock_variant_for_that_figure() -> None:
    run = [
        deployment(0, "stock-management", [10, 11, 12], [900, 1000, 1100], 1.0),
        deployment(1, "overlay", [30, 31, 29], [1200, 1200, 1200], 1.0),
        deployment(2, "stock-ring", [20, 21, 22], [500, 600, 700], 3.5),  # faster decode, slower prefill
        deployment(3, "overlay", [30, 30, 30], [1200, 1200, 1200], 1.0),
    ]
    plan = {"stock_variants": ["stock-management", "stock-ring"]}
    doc = runs.summarize(run, plan, cores=2)
    assert doc["best_stock"] == {"decode": "stock-ring", "prefill": "stock-management"}
    assert doc["decode_ratio_vs_best_stock"] == 30 / 21
    assert doc["prefill_ratio_vs_best_stock"] == 1200 / 1000
    assert doc["rounds_interleaved"] is True
    assert doc["deployment_order"] == ["stock-management", "overlay", "stock-ring", "overlay"]
    assert doc["stock_variants"]["stock-ring"]["decode_tok_s_rounds"] == [20, 21, 22]
    assert doc["rounds_over_core_count"] == {"rounds": 3, "of": 12, "cores": 2}
    assert "3 of 12 rounds" in runs.headline(doc)


def test_a_run_continues_across_calls_only_with_the_same_plan(tmp_path: Path) -> None:
    log = runs.deployments_log(tmp_path / "serving.json")
    plan = {"order": ["stock-management", "overlay"], "git_commit": "a"}
    run_id, done = runs.current_run(log, plan)
    assert done == []
    append_run(log, {"run_id": run_id, "plan": plan, "index": 0})
    assert runs.current_run(log, plan) == (run_id, [{"run_id": run_id, "plan": plan, "index": 0}])
    other_id, other = runs.current_run(log, plan | {"git_commit": "b"})  # another commit: a new run
    assert other == [] and other_id != run_id
    append_run(log, {"run_id": run_id, "plan": plan, "index": 1})
    assert runs.current_run(log, plan)[1] == []  # that run is complete: the next call starts another
    failed_id, _ = runs.current_run(log, plan)
    append_run(log, {"run_id": failed_id, "plan": plan, "index": 0, "failed": "RuntimeError: launch failed"})
    assert runs.current_run(log, plan)[1] == []  # a failed deployment ends its run: never measured again


def test_stock_reaches_every_rank_over_the_ring_the_diagonal_through_a_neighbour() -> None:
    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories" / "sim" / "cluster.yml"))
    routes = sim_network.management_routes(hostvars)
    src = "198.19.254.10"  # r0's own management address: replies to it need no ring route back
    assert routes["r0"] == [
        {"to": "198.19.254.11", "via": "198.19.0.2", "dev": "ring0", "src": src},  # r1 over cable r0-r1
        {"to": "198.19.254.12", "via": "198.19.0.2", "dev": "ring0", "src": src},  # r2 through r1
        {"to": "198.19.254.13", "via": "198.19.3.1", "dev": "ring1", "src": src},  # r3 over cable r3-r0
    ]
    assert routes["r1"][2] == {
        "to": "198.19.254.13",
        "via": "198.19.1.2",
        "dev": "ring1",
        "src": "198.19.254.11",
    }
    for host, host_routes in routes.items():  # every next hop is on one of the rank's own cables
        peers = {p["peer_address"] for p in hostvars[host]["sparkring_ports"]}
        assert len(host_routes) == 3 and {r["via"] for r in host_routes} <= peers
        assert {r["src"] for r in host_routes} == {hostvars[host]["sparkring_management"]["address"]}


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "INFO 12-01 [parallel_state.py:1907] world_size=4 rank=1 local_rank=0 "
            "distributed_init_method=tcp://198.19.254.10:29500 backend=gloo\n",
            "backend=gloo",
        ),
        (
            "\x1b[1;36m(Worker pid=9)\x1b[0m INFO CPU SHM communicator disabled for group tp:0: ranks do not "
            "share the same SHM group name, falling back to torch.distributed.\n",
            "SHM communicator disabled",
        ),
    ],
)
def test_vllm_lines_that_name_the_backend_are_kept(log: str, expected: str) -> None:
    lines = runs.backend_lines(log + "INFO unrelated line\n")
    assert len(lines) == 1 and expected in lines[0] and "\x1b" not in lines[0]


def test_stock_must_say_gloo_on_every_rank_and_the_overlay_must_keep_every_all_reduce_on_the_ring() -> None:
    with pytest.raises(RuntimeError, match=r"no 'backend=gloo' line from vLLM on \['r2'\]"):
        runs.require_gloo({"r1": ["... backend=gloo"], "r2": ["... backend=nccl"]})
    ok = {"rank": 0, "mode": "custom", "counters": {"all_reduce.ring": 9}}
    assert runs.ring_all_reduces([ok]) == {0: 9}
    with pytest.raises(RuntimeError, match="did not run every all-reduce on the ring"):
        runs.ring_all_reduces([ok, {"rank": 1, "mode": "custom", "counters": {"all_reduce.fallback": 1}}])
    with pytest.raises(RuntimeError, match="no dumps"):
        runs.ring_all_reduces([])


def test_the_overlay_side_keeps_each_ranks_recorder_summary_without_its_entries() -> None:
    dump = {
        "rank": 2,
        "mode": "custom",
        "collectives": 9,
        "counters": {"all_reduce.ring": 9},
        "entries": [{}],
    }
    assert runs.flight_recorders({"r2": dump}) == {
        "flight_recorder": {
            "r2": {"rank": 2, "mode": "custom", "collectives": 9, "counters": {"all_reduce.ring": 9}}
        },
        "ring_all_reduces_per_rank": {2: 9},
    }
    with pytest.raises(RuntimeError, match="did not run every all-reduce on the ring"):
        runs.flight_recorders({"r2": dump | {"mode": "shadow"}})
