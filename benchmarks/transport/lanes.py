"""Connections per link: the host engine's large all-reduce over one TCP connection per link, or
striped by the engine over several (transport.fabric_tcp; issue 27: the gap to NCCL-socket above
1 MB).

    python3 -m benchmarks.transport.lanes   # -> benchmarks/results/transport_lanes.json + .png

Every rank process opens one communicator per connection count asked for, each on its own port
of the loopback cable geometry (127.77.i.0/24), with that many connections per link; from
``--stripe-min-bytes`` a transfer is cut into one part per connection and the engine moves the
parts at once, each on its own threads. k = 1 is the engine unstriped. Connection counts take
turns within every round; the p50 of each is rank 0's, the results must equal one connection's
bit for bit, and each striped communicator's links must have carried bytes on their further
connections (``stripe_bytes_tx``). Every run is appended to the history beside the results file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.history import append_run, history_path
from benchmarks.provenance import ROOT, RunProvenance
from tests.unit.transport.transport_ranks import run_ring

RESULTS = ROOT / "benchmarks" / "results" / "transport_lanes.json"


def rank_main(spec: Any, port: int, *, cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank: every round, every size, each lane count in turn; p50 ms per (size, lanes)."""
    import numpy as np

    from transport.comm import Communicator

    comms = {
        k: Communicator(
            spec,
            tcp_port=port + 100 * i,
            timeout_s=60,
            connections=k,
            stripe_min_bytes=cfg["stripe_min_bytes"],
        )
        for i, k in enumerate(cfg["lanes"])
    }
    rounds, equal = [], True
    try:
        for _ in range(cfg["rounds"]):
            row: dict[str, float] = {}
            for size in cfg["sizes"]:
                x = np.random.default_rng(spec.rank).standard_normal(size // 2).astype(np.float16)
                whole = None
                for lanes, comm in comms.items():
                    times = []
                    for _ in range(cfg["iters"]):
                        y = x.copy()
                        start = time.perf_counter()
                        comm.all_reduce(y, out=y)
                        times.append(time.perf_counter() - start)
                    row[f"{size}_lanes{lanes}"] = round(statistics.median(times) * 1e3, 3)
                    if whole is None:
                        whole = y
                    else:
                        equal = equal and bool(np.array_equal(whole.view(np.uint16), y.view(np.uint16)))
            rounds.append(row)
        striped = {k: sum(s["stripe_bytes_tx"] for s in comm.stats().values()) for k, comm in comms.items()}
    finally:
        for comm in comms.values():
            comm.close()
    return {"rounds": rounds, "bitwise_equal": equal, "stripe_bytes_tx": striped}


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = RunProvenance.capture()
    cfg = {
        "sizes": args.sizes,
        "lanes": args.lanes,
        "iters": args.iters,
        "rounds": args.rounds,
        "stripe_min_bytes": args.stripe_min_bytes,
    }
    worlds = {}
    for i, world in enumerate(args.worlds):
        ranks = run_ring(rank_main, world, args.port + 7 * i, timeout_s=900, cfg=cfg)
        failed = [value for status, value in ranks if status != "ok"]
        if failed:
            raise SystemExit(f"world {world}: a rank failed: {failed[0]}")
        rank0 = ranks[0][1]
        summary = {
            key: round(statistics.median(r[key] for r in rank0["rounds"]), 3) for key in rank0["rounds"][0]
        }
        worlds[str(world)] = {**rank0, "p50_ms_median_of_rounds": summary}
    return {
        "schema": "sparkring.bench.transport_lanes/2",
        "machine": {"cpu": platform.machine(), "cores": os.cpu_count()},
        "config": {**cfg, "dtype": "float16", "fabric": "tcp", "geometry": "127.77.i.0/24 loopback"},
        "worlds": worlds,
        "provenance": start.finish(),
    }


def plot(res: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, lanes = res["config"]["sizes"], res["config"]["lanes"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.5), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for world, data in res["worlds"].items():
            ax.plot(
                lanes,
                [data["p50_ms_median_of_rounds"][f"{size}_lanes{k}"] for k in lanes],
                "o-",
                label=f"{world} ranks",
            )
        ax.set(
            title=f"{size >> 20} MiB fp16 all-reduce",
            xlabel="connections per link",
            ylabel="p50 ms",
            xticks=lanes,
        )
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=_ints, default=[2, 4])
    ap.add_argument("--lanes", type=_ints, default=[1, 2, 4], help="connections per link, in turn")
    ap.add_argument("--sizes", type=_ints, default=[4 << 20, 16 << 20, 64 << 20], help="bytes")
    ap.add_argument("--iters", type=int, default=15, help="calls per size and lane count in a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--stripe-min-bytes", type=int, default=1 << 20, help="the fewest bytes a transfer is striped from"
    )
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    append_run(history_path(args.out), res)
    plot(res, args.out.with_suffix(".png"))
    print(json.dumps({w: d["p50_ms_median_of_rounds"] for w, d in res["worlds"].items()}, indent=1))


if __name__ == "__main__":
    main()
