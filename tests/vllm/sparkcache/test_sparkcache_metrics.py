"""sparkring:* series through vLLM's KV-connector stats hooks: worker deltas, their sum over the ring's
workers, and the Prometheus text rank 0's /metrics serves (vLLM's own prometheus_client, no server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sparkcache_vllm_harness import REPO, VLLM_BIN, metric_total, sample, vllm_missing_reason

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason()))


@pytest.fixture(scope="module")
def exposition() -> str:
    done = subprocess.run(
        [str(VLLM_BIN / "python"), str(Path(__file__).with_name("metrics_probe.py"))],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_ring_collectives_sum_over_ranks_by_op_and_path(exposition: str) -> None:
    for rank in ("0", "1"):
        assert (
            sample(exposition, "sparkring:ring_collectives_total", op="all_reduce", path="ring", rank=rank)
            == 7
        )
    assert sample(exposition, "sparkring:shadow_comparisons_total", op="all_reduce", rank="0") == 5
    assert metric_total(exposition, "sparkring:shadow_mismatches_total") == 0


def test_transport_bytes_per_directed_cable_and_errors_per_cable(exposition: str) -> None:
    assert sample(exposition, "sparkring:transport_bytes_total", link="0->1") == 4096
    assert sample(exposition, "sparkring:transport_bytes_total", link="0->3") == 1024
    assert sample(exposition, "sparkring:transport_errors_total", cable="0-1") == 1


def test_sparkcache_pages_and_restore_rate(exposition: str) -> None:
    assert sample(exposition, "sparkring:sparkcache_pages_total", event="stored", rank="0") == 3
    assert sample(exposition, "sparkring:sparkcache_pages_total", event="restored", rank="0") == 2
    assert sample(exposition, "sparkring:sparkcache_restore_bytes_total", rank="0") == 8 << 20
    assert sample(exposition, "sparkring:sparkcache_restore_bytes_per_second", rank="0") == 16 << 20


def test_sparkcache_publication_failures_per_rank_and_reason(exposition: str) -> None:
    assert (
        sample(exposition, "sparkring:sparkcache_publication_failures_total", rank="0", reason="eperm") == 1
    )
    assert (
        sample(exposition, "sparkring:sparkcache_publication_failures_total", rank="0", reason="disk_full")
        == 2
    )
