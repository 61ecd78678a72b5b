"""Run in .venv-vllm by test_sparkcache_metrics.py: drive sparkcache.metrics as vLLM does and print
what /metrics would show (Prometheus text) for a private registry."""

from __future__ import annotations

import functools
import sys
import types

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter

from overlay.recorder import RECORDER
from overlay.ring import GROUPS

# The overlay as a worker has it after a few collectives (sparkcache.metrics imports these very
# objects): recorder counters, and a ring group whose communicator reports its bytes per neighbour.
RECORDER.counters.update(
    {"all_reduce.ring": 5, "all_reduce.shadow_compared": 5, "all_reduce.error": 1, "cable_error.0-1": 1}
)
GROUPS._comms["tp:0"] = types.SimpleNamespace(
    stats=lambda: {1: {"bytes_tx": 4096, "bytes_rx": 4096}, 3: {"bytes_tx": 1024}}
)

from sparkcache.connector import SparkCacheConnector  # noqa: E402
from sparkcache.metrics import Telemetry  # noqa: E402

worker = Telemetry(rank=0)
worker.count("sparkcache_pages", 3, event="stored")
first = worker.delta()
RECORDER.counters["all_reduce.ring"] += 2
worker.count("sparkcache_pages", 2, event="restored")
worker.count("sparkcache_restore_bytes", 8 << 20)
worker.count("sparkcache_restore_seconds", 0.5)
worker.count("sparkcache_publication_failures", reason="eperm")
worker.count("sparkcache_publication_failures", 2, reason="disk_full")
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
