"""Run in .venv-vllm by test_sparkcache_metrics.py: drive sparkcache.metrics as vLLM does and print
what /metrics would show (Prometheus text) for a private registry."""

from __future__ import annotations

import functools
import sys
import types
from collections import Counter

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter

# The overlay as a worker has it after a few collectives: recorder counters and ring groups.
recorder = types.ModuleType("overlay.recorder")
recorder.RECORDER = types.SimpleNamespace(
    counters=Counter(
        {"all_reduce.ring": 5, "all_reduce.shadow_compared": 5, "all_reduce.error": 1, "cable_error.0-1": 1}
    )
)
ring = types.ModuleType("overlay.ring")
ring.GROUPS = types.SimpleNamespace(
    stats=lambda: {
        "tp:0": {1: {"bytes_tx": 4096, "bytes_rx": 4096}, 3: {"bytes_tx": 1024}},
        "tp:0.progress": {},
    }
)
sys.modules["overlay.recorder"], sys.modules["overlay.ring"] = recorder, ring

from sparkcache.connector import SparkCacheConnector  # noqa: E402
from sparkcache.metrics import Telemetry  # noqa: E402

worker = Telemetry(rank=0)
worker.count("sparkcache_pages", 3, event="stored")
first = worker.delta()
recorder.RECORDER.counters["all_reduce.ring"] += 2
worker.count("sparkcache_pages", 2, event="restored")
worker.count("sparkcache_restore_bytes", 8 << 20)
worker.count("sparkcache_restore_seconds", 0.5)
second = worker.delta()
assert worker.delta() == {}, "nothing moved: nothing to report"

other_rank = SparkCacheConnector.build_kv_connector_stats(
    {"ring_collectives|rank=1|op=all_reduce|path=ring": 7}
)
step = SparkCacheConnector.build_kv_connector_stats(first).aggregate(other_rank)
registry = CollectorRegistry()
types_ = {
    PromCounter: functools.partial(PromCounter, registry=registry),
    Gauge: functools.partial(Gauge, registry=registry),
    Histogram: functools.partial(Histogram, registry=registry),
}
config = types.SimpleNamespace(kv_transfer_config=None)
prom = SparkCacheConnector.build_prom_metrics(
    config, types_, ["model_name", "engine"], {0: ["sim-tiny", "0"]}
)
prom.observe(step.reduce(), 0)
prom.observe(SparkCacheConnector.build_kv_connector_stats(second).reduce(), 0)
sys.stdout.write(generate_latest(registry).decode())
