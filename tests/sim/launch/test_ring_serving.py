"""TP4 on the simulated ring through the overlay and SparkCache, deployed as `make sim` does.

Two deployments for the module, each a real launch through playbooks/launch.yml:

1. the sim profile as shipped (`OVERLAY_MODE=custom`): the ring transport carries the tensor-parallel
   all-reduces; a long prompt is published to SparkCache on every rank;
2. the same profile in `shadow` mode, a four-process replacement: every collective runs on the ring
   and on stock gloo and stock's result is returned, so its completions are stock's; the long prompt
   is restored from SparkCache on every rank.

Custom must answer token for token what stock answers, shadow must count zero mismatches, the
flight recorders must show the ring carried the all-reduces, and the restored prompt must give the
cold run's output. The module stops and removes its containers afterwards, always.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from pathlib import Path

import pytest
from launch_harness import (
    HEAD_API,
    RANKS,
    ROOT,
    SIM_RANKS,
    Launches,
    complete,
    container_log,
    dump_flight_recorders,
    profile_variant,
)

from sparkcache import CHUNK_TOKENS

pytestmark = [pytest.mark.sim, pytest.mark.slow]

PROMPTS = ["The ring of four", "def fibonacci(n):", "import os\nimport sys\n\nclass", "for i in range(10):"]
LONG_TOKENS = 600  # two full SparkCache chunks restorable; the tail is recomputed
RESTORED = (LONG_TOKENS - 1) // CHUNK_TOKENS * CHUNK_TOKENS
LOADED = re.compile(r"SparkCache: loaded (\d+) tokens \((\d+) page\(s\) verified\)")


def long_prompt(seed: int) -> list[int]:
    """Token ids no earlier run has cached (the ranks' stores outlive deployments)."""
    rng = random.Random(seed)
    return [rng.randrange(4, 1000) for _ in range(LONG_TOKENS)]


def snapshots(host: str) -> list[Path]:
    return sorted((SIM_RANKS / host / "var-lib-sparkring" / "sparkcache").glob("id-*/snapshots/*.json"))


def wait_for_snapshots(before: dict[str, int], timeout_s: float = 120) -> dict[str, int]:
    """SparkCache publishes after the request finishes: wait (bounded) until every rank has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = {host: len(snapshots(host)) for host in RANKS}
        if all(now[host] > before[host] for host in RANKS):
            return now
        time.sleep(1)
    raise TimeoutError(f"SparkCache snapshots per rank stayed {before} for {timeout_s}s")


SERIES = re.compile(r"^(sparkring:\w+)\{([^}]*)\} (\S+)$", re.M)


def metrics() -> dict[tuple[str, frozenset], float]:
    """Rank 0's /metrics (vLLM's own endpoint), the sparkring:* series by name and labels."""
    done = subprocess.run(
        ["ip", "netns", "exec", "sr-ctl", "curl", "-sS", "--max-time", "30", f"{HEAD_API}/metrics"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {
        (name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels))): float(value)
        for name, labels, value in SERIES.findall(done.stdout)
    }


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    """How far the series of `name` matching `labels` moved (summed over their other labels)."""
    want = set(labels.items())

    def total(scrape: dict) -> float:
        return sum(v for (n, ls), v in scrape.items() if n == name and want <= ls)

    return total(after) - total(before)


def metrics_after_publication(before: dict, tries: int = 10) -> dict:
    """A later step carries the publishers' counts to /metrics: complete until every rank's show."""
    for _ in range(tries):
        complete(PROMPTS[0], max_tokens=2)
        after = metrics()
        stored = [
            moved(before, after, "sparkring:sparkcache_pages_total", event="stored", rank=r) for r in "0123"
        ]
        if min(stored) >= RESTORED // CHUNK_TOKENS:
            break
    return after


def serve(launches: Launches, long: list[int], *extra: str) -> dict:
    done = launches.playbook("launch.yml", *extra)
    assert done.returncode == 0, f"launch failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    scrape_before = metrics()
    texts = [complete(p, max_tokens=16)["choices"][0]["text"] for p in PROMPTS * 3]
    before = {host: len(snapshots(host)) for host in RANKS}
    long_text = complete(long, max_tokens=8)["choices"][0]["text"]
    return {
        "texts": texts,
        "long_text": long_text,
        "metrics_before": scrape_before,
        "metrics_after": metrics(),
        "snapshots_before": before,
        "dumps": dump_flight_recorders(),
        "logs": {host: container_log(host) for host in RANKS},
    }


@pytest.fixture(scope="module")
def runs(sim_ring, tmp_path_factory: pytest.TempPathFactory):
    if not (ROOT / ".cache/sim-model/config.json").is_file():
        pytest.skip("the tiny model is missing: run `make sim-model`")
    image = sim_ring(["ansible-playbook", "playbooks/image.yml"], timeout=3000)
    assert image.returncode == 0, f"playbooks/image.yml failed:\n{image.stdout[-4000:]}"
    # ... and the model, verified on every rank (a no-op when they already hold it).
    model = sim_ring(["ansible-playbook", "playbooks/model.yml"], timeout=1200)
    assert model.returncode == 0, f"playbooks/model.yml failed:\n{model.stdout[-4000:]}"
    launches = Launches(sim_ring)
    shadow = profile_variant(tmp_path_factory.mktemp("shadow"), OVERLAY_MODE="shadow")
    long = long_prompt(time.time_ns())
    try:
        custom = serve(launches, long, "-e", "launch_force=true")
        custom["snapshots_after"] = wait_for_snapshots(custom["snapshots_before"])
        custom["metrics_published"] = metrics_after_publication(custom["metrics_before"])
        shadow_run = serve(launches, long, "-e", f"launch_profile_file={shadow}")
        yield {"custom": custom, "shadow": shadow_run}
    finally:
        stopped = launches.playbook("stop.yml", "-e", "launch_stop_remove=true")
        assert stopped.returncode == 0, stopped.stdout[-3000:]


def test_custom_mode_answers_token_for_token_what_stock_answers(runs) -> None:
    assert all(runs["custom"]["texts"])
    assert runs["custom"]["texts"] == runs["shadow"]["texts"]


def test_the_ring_carried_every_all_reduce_in_custom_mode(runs) -> None:
    dumps = runs["custom"]["dumps"]
    assert {host: dump["rank"] for host, dump in dumps.items()} == {h: int(h[1:]) for h in RANKS}
    counters = [dump["counters"] for dump in dumps.values()]
    assert all(dump["mode"] == "custom" for dump in dumps.values())
    assert all(c == counters[0] for c in counters)  # lock-step: the same collectives on every rank
    assert counters[0]["all_reduce.ring"] > 100
    assert "all_reduce.fallback" not in counters[0] and "all_reduce.stock" not in counters[0]


def test_shadow_mode_counts_zero_mismatches(runs) -> None:
    for dump in runs["shadow"]["dumps"].values():
        c = dump["counters"]
        assert dump["mode"] == "shadow"
        assert c["all_reduce.shadow_compared"] == c["all_reduce.ring"] == c["all_reduce.stock"] > 100
        assert not {k: v for k, v in c.items() if k.endswith("shadow_mismatch")}


def test_every_rank_restores_the_long_prompt_after_the_replacement(runs) -> None:
    assert not any(LOADED.search(log) for log in runs["custom"]["logs"].values())  # a cold store
    for host in RANKS:
        loaded = LOADED.findall(runs["shadow"]["logs"][host])
        assert loaded and int(loaded[0][0]) == RESTORED, (host, runs["shadow"]["logs"][host][-3000:])
    assert runs["shadow"]["long_text"] == runs["custom"]["long_text"]


def test_rank_0_metrics_show_the_ring_the_cables_and_sparkcache_moving(runs) -> None:
    """vLLM's /metrics on rank 0 carries every rank's sparkring:* series (KV-connector stats hooks)."""
    custom, shadow = runs["custom"], runs["shadow"]
    before, after = custom["metrics_before"], custom["metrics_after"]
    for rank in ("0", "1", "2", "3"):
        ring = moved(
            before, after, "sparkring:ring_collectives_total", op="all_reduce", path="ring", rank=rank
        )
        assert ring > 100, (rank, ring)
        for peer in {str((int(rank) + 1) % 4), str((int(rank) + 3) % 4)}:
            assert moved(before, after, "sparkring:transport_bytes_total", link=f"{rank}->{peer}") > 0
        stored = moved(
            before, custom["metrics_published"], "sparkring:sparkcache_pages_total", event="stored", rank=rank
        )
        assert stored >= RESTORED // CHUNK_TOKENS, (rank, stored)
    assert moved(before, after, "sparkring:transport_errors_total") == 0
    assert moved(before, after, "sparkring:shadow_comparisons_total") == 0  # custom mode compares nothing
    before, after = shadow["metrics_before"], shadow["metrics_after"]
    assert moved(before, after, "sparkring:shadow_comparisons_total", op="all_reduce") > 100
    assert moved(before, after, "sparkring:shadow_mismatches_total") == 0
    for rank in ("0", "1", "2", "3"):
        for event in ("verified", "restored"):
            pages = moved(before, after, "sparkring:sparkcache_pages_total", event=event, rank=rank)
            assert pages == RESTORED // CHUNK_TOKENS, (rank, event, pages)
        assert moved(before, after, "sparkring:sparkcache_restore_bytes_total", rank=rank) > 0
