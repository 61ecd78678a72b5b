"""SparkRing's Prometheus series on vLLM's own /metrics, through vLLM's KV-connector stats hooks.

vLLM asks every worker's KV connector for `get_kv_connector_stats()` after each step, sums what
all workers of the ring return (rank 0 collects them from the headless ranks too), and hands the
sum to the API server's Prometheus logger, which calls the connector class's
`build_prom_metrics()` object. SparkCache is that connector, so the worker side reports, as
deltas since its last report:

- the overlay's collectives by op and path (ring, graph, stock, fallback), its shadow
  comparisons and mismatches, transport errors by cable (overlay/recorder.py's counters,
  imported here: the overlay's recorder and ring groups of this process; a peer death stops the
  worker at once, so the recovery agent counts those, per cable);
- the transport's bytes per directed cable (the engine's own per-neighbour counters);
- SparkCache's pages stored, restored, verified and quarantined, snapshots evicted, publications
  that failed (by reason), and the bytes and seconds of restores (rank 0's logger turns the last
  interval into bytes/s).

Keys are `family|label=value|...`; the values are deltas, so aggregation is a sum.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from overlay.recorder import RECORDER
from overlay.ring import GROUPS

PREFIX = "sparkring:"
# family -> (kind, extra label names, help). Counters gain `_total` on /metrics.
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "ring_collectives": ("counter", ("rank", "op", "path"), "Overlay collectives by op and path"),
    "shadow_comparisons": ("counter", ("rank", "op"), "Shadow-mode collectives compared with stock"),
    "shadow_mismatches": ("counter", ("rank", "op"), "Shadow-mode collectives that differed from stock"),
    "transport_bytes": ("counter", ("link",), "Transport payload bytes sent over a cable, one direction"),
    "transport_errors": ("counter", ("cable",), "Transport errors of collectives, by the cable they named"),
    "peer_deaths": (
        "counter",
        ("cable",),
        "Peers declared dead by the transport, by the cable that lost them",
    ),
    "sparkcache_pages": (
        "counter",
        ("rank", "event"),
        "SparkCache pages stored, restored, verified, quarantined",
    ),
    "sparkcache_evictions": ("counter", ("rank",), "SparkCache snapshots evicted by the limits"),
    "sparkcache_publication_failures": (
        "counter",
        ("rank", "reason"),
        "SparkCache publications that failed (nothing was stored), by reason",
    ),
    "sparkcache_restore_bytes": ("counter", ("rank",), "SparkCache bytes restored into the KV cache"),
    "sparkcache_restore_seconds": ("counter", ("rank",), "SparkCache seconds spent restoring"),
    "sparkcache_restore_bytes_per_second": ("gauge", ("rank",), "SparkCache restore rate, last interval"),
}
# Overlay recorder counters that are not collectives by path.
_SHADOW = {"shadow_compared": "shadow_comparisons", "shadow_mismatch": "shadow_mismatches"}
# Recorder counters `<name>.<low>-<high>` that count per cable (the overlay's transport error paths).
_CABLE = {"cable_error": "transport_errors"}


def series(family: str, **labels: object) -> str:
    return "|".join([family, *(f"{name}={labels[name]}" for name in FAMILIES[family][1])])


def parse(key: str) -> tuple[str, dict[str, str]]:
    family, *pairs = key.split("|")
    return family, dict(pair.split("=", 1) for pair in pairs)


def overlay_totals(rank: int) -> dict[str, float]:
    """Cumulative overlay and transport counters of this process (none while the overlay is off:
    its recorder then counts nothing and no group rides the ring)."""
    out: dict[str, float] = {}
    for name, count in dict(RECORDER.counters).items():
        op, _, what = name.partition(".")
        if op in _CABLE:
            out[series(_CABLE[op], cable=what)] = count
        elif what in _SHADOW:
            out[series(_SHADOW[what], rank=rank, op=op)] = count
        elif what and what != "error":
            out[series("ring_collectives", rank=rank, op=op, path=what)] = count
    for group, peers in GROUPS.stats().items():
        if group.endswith(".progress"):  # GPU progress-thread counters, not bytes on a cable
            continue
        for peer, counters in peers.items():
            key = series("transport_bytes", link=f"{rank}->{peer}")
            out[key] = out.get(key, 0) + counters.get("bytes_tx", 0)
    return out


class Telemetry:
    """One worker's counters: SparkCache events as they happen, and deltas of everything to report."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._events: Counter[str] = Counter()
        self._reported: dict[str, float] = {}
        self._lock = threading.Lock()

    def count(self, family: str, n: float = 1, **labels: object) -> None:
        with self._lock:
            self._events[series(family, rank=self.rank, **labels)] += n

    def delta(self) -> dict[str, float]:
        """What moved since the last call (overlay counters are cumulative: report differences)."""
        with self._lock:
            now = {**overlay_totals(self.rank), **self._events}
        out = {key: value - self._reported.get(key, 0) for key, value in now.items()}
        self._reported = now
        return {key: value for key, value in out.items() if value}


class SparkRingStats(KVConnectorStats):
    """Deltas from the workers of one step, summed across workers and steps."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not self.data


class SparkRingPromMetrics(KVConnectorPromMetrics):
    """The `sparkring:*` series, labelled like vLLM's own (model_name, engine) plus their own."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        classes = {"counter": self._counter_cls, "gauge": self._gauge_cls}
        self._metrics = {
            family: classes[kind](name=PREFIX + family, documentation=doc, labelnames=[*labelnames, *extra])
            for family, (kind, extra, doc) in FAMILIES.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        base = self.per_engine_labelvalues[engine_idx]
        restored: dict[str, list[float]] = {}
        for key, value in transfer_stats_data.items():
            family, labels = parse(key)
            if family not in FAMILIES or family == "sparkcache_restore_bytes_per_second":
                continue
            values = [*base, *(labels[name] for name in FAMILIES[family][1])]
            self._metrics[family].labels(*values).inc(value)
            if family in ("sparkcache_restore_bytes", "sparkcache_restore_seconds"):
                pair = restored.setdefault(labels["rank"], [0.0, 0.0])
                pair[family == "sparkcache_restore_seconds"] += value
        for rank, (nbytes, seconds) in restored.items():
            if seconds > 0:
                self._metrics["sparkcache_restore_bytes_per_second"].labels(*base, rank).set(nbytes / seconds)
