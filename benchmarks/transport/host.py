"""``bench.py host``: the engine's own limit, unshaped loopback at 2 and 4 ranks against gloo.

No root; needs numpy, torch for gloo, and a C compiler (matplotlib only for the plot). The ranks
are processes on this machine's loopback on the inventory's cable geometry (127.77.i.0/24),
unshaped, fp32 from 16 KB to 64 MB. gloo binds ``lo``; loopback reaches every pair, which gloo
needs and a switchless ring does not have.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.provenance import RunProvenance
from benchmarks.transport.ranks import BIG, spawn_ranks, summarize, worker_cfg
from benchmarks.transport.results import write
from transport import schedule

HOST_PREFIX = "127.77"
HOST_SIZES = tuple(16384 << (2 * i) for i in range(7))  # 16 KB, 64 KB, ... 64 MB
HOST_WORLDS = (2, 4)
# The headline ratios and the side of 1.0 (or 0.5) each must stay on.
TARGETS = {
    "busbw_64m_ratio_vs_gloo_w2": 1.0,
    "busbw_64m_ratio_vs_gloo_w4": 1.0,
    "p50_16k_ratio_vs_gloo_w4": 0.5,
}


def host(args: argparse.Namespace) -> None:
    start, t0 = RunProvenance.capture(), time.monotonic()
    worlds = {}
    for i, world in enumerate(args.worlds):
        cfg = worker_cfg(args, args.sizes, HOST_PREFIX, args.port + 10 * i, ("127.0.0.1", "lo"))
        per_rank = spawn_ranks(world, lambda r, argv: argv, cfg)
        worlds[str(world)] = {
            "sparkring_algorithms": {str(s): schedule.allreduce_algorithm(world, s) for s in args.sizes},
            "allreduce_fp32": summarize(per_rank, world, args.sizes),
        }
    doc: dict = {
        "schema": "sparkring.bench.transport_host/1",
        "provenance": start.finish(),
        "seconds": round(time.monotonic() - t0, 1),
        "setup": {
            "links": "loopback, the inventory's cable geometry on 127.77.i.0/24, unshaped",
            "fabric": "tcp",
            "dtype": "float32",
            "rounds": args.rounds,
            "block_bytes": args.block_bytes,
            "gloo": "torch.distributed gloo on lo, every pair connected",
        },
        "worlds": worlds,
        "notes": "per size, SparkRing and gloo take turns in the same processes (rounds alternate which goes "
        "first); p50/p99 are the slowest rank's; busbw = 2(N-1)/N x bytes / p50",
    }
    for world in args.worlds:
        cells = worlds[str(world)]["allreduce_fp32"]
        if str(BIG) in cells:
            big = cells[str(BIG)]
            doc[f"busbw_64m_ratio_vs_gloo_w{world}"] = round(
                big["sparkring"]["busbw_gbyte_s"] / big["gloo"]["busbw_gbyte_s"], 4
            )
        for size, name in ((16384, "16k"), (262144, "256k")):
            if str(size) in cells:
                doc[f"p50_{name}_ratio_vs_gloo_w{world}"] = cells[str(size)]["p50_ratio_vs_gloo"]
    doc["targets"] = {k: (">= " if k.startswith("busbw") else "<= ") + str(v) for k, v in TARGETS.items()}
    doc["targets_met"] = {
        k: (doc[k] >= v if k.startswith("busbw") else doc[k] <= v) for k, v in TARGETS.items() if k in doc
    }
    write(doc, Path(args.out), tuple(k for k in doc if "_ratio_vs_gloo_w" in k), plot_host)


def plot_host(doc: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for world, cell in doc["worlds"].items():
        cells = cell["allreduce_fp32"]
        sizes = [int(s) for s in cells]
        for impl, style in (("sparkring", "-o"), ("gloo", "--s")):
            label = f"{impl} w{world}"
            axes[0].plot(sizes, [cells[str(s)][impl]["p50_us"] for s in sizes], style, label=label)
            axes[1].plot(sizes, [cells[str(s)][impl]["busbw_gbyte_s"] for s in sizes], style, label=label)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes (fp32)")
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("all-reduce p50, us (slowest rank)")
    axes[1].set_ylabel("bus bandwidth, GB/s")
    p = doc["provenance"]
    load = f"{p['load_avg_start']['1m']}-{p['load_avg_end']['1m']}"
    fig.suptitle(
        f"host path, unshaped loopback: {p['cpu_cores']} cores ({p['cpu_model']}), load {load}, {p['started_utc']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
