"""The rank processes of the transport benchmark: one per rank, SparkRing and gloo taking turns.

Every rank process holds a SparkRing communicator and a gloo process group at once, and for each
size the two take turns (rounds of SparkRing then gloo, then gloo then SparkRing, ...), so a
change of load during the run lands on both. A figure is the slowest rank's p50 (a collective is
as fast as its slowest member); bus bandwidth is 2(N-1)/N x bytes / p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from benchmarks.provenance import ROOT
from transport.topology import cable_geometry

IMPLS = ("sparkring", "gloo")
BIG = 64 << 20  # the bandwidth size: 64 MB
RANK_TIMEOUT_S = 600


def _pct(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50": round(s[len(s) // 2], 2), "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2)}


def block_iterations(size: int, budget: int) -> int:
    """Calls per turn: ``budget`` bytes' worth, at least one and at most 50."""
    return max(1, min(50, budget // size))


def busbw_gbyte_s(world: int, size: int, p50_us: float) -> float:
    """Bus bandwidth (nccl-tests' definition for all-reduce): 2(N-1)/N x bytes / time."""
    return round(2 * (world - 1) / world * size / (p50_us * 1e-6) / 1e9, 4)


def worker(args: argparse.Namespace) -> None:
    """Time all-reduces for one rank, SparkRing and gloo taking turns per size; print JSON."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from transport.comm import Communicator

    torch.set_num_threads(1)
    spec = cable_geometry(args.rank, args.world, args.prefix)
    comm = Communicator(spec, tcp_port=args.port, timeout_s=120)
    os.environ["GLOO_SOCKET_IFNAME"] = args.gloo_ifname or f"ring{spec.port_to(spec.left).cage}"
    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.gloo_addr}:{args.port + 1}", rank=args.rank, world_size=args.world
    )

    def sparkring(x: np.ndarray) -> None:
        comm.all_reduce(x, out=x)  # in place, as gloo does

    def gloo(x: np.ndarray) -> None:
        dist.all_reduce(torch.from_numpy(x))

    calls: dict[str, Callable[[np.ndarray], None]] = {"sparkring": sparkring, "gloo": gloo}
    want = args.world * (args.world + 1) // 2
    out: dict[str, dict] = {}
    for size in args.sizes:
        x = np.full(size // 4, args.rank + 1, dtype=np.float32)  # small integers: every sum is exact
        y = x.copy()  # one buffer, touched once: fresh pages are slow here and not what we measure
        iters = block_iterations(size, args.block_bytes)
        times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        for rnd in range(args.rounds + 1):  # round 0 warms both up and is not kept
            for impl in IMPLS if rnd % 2 else IMPLS[::-1]:
                dist.barrier()  # both start each turn together
                for _ in range(iters if rnd else 2):
                    np.copyto(y, x)
                    t0 = time.perf_counter()
                    calls[impl](y)
                    if rnd:
                        times[impl].append((time.perf_counter() - t0) * 1e6)
                    if y[0] != want or y[-1] != want:
                        raise SystemExit(f"{impl} all-reduce of {size} B returned {y[0]}, expected {want}")
        out[str(size)] = {
            impl: {"iterations": len(t), **_pct(t), "mean": round(statistics.fmean(t), 2)}
            for impl, t in times.items()
        }
    comm.close()
    dist.destroy_process_group()
    print(json.dumps(out))


def worker_cfg(
    args: argparse.Namespace, sizes: tuple[int, ...], prefix: str, port: int, gloo: tuple[str, str]
) -> list[str]:
    """The `bench.py worker` arguments every rank of one run shares."""
    return [
        "--prefix",
        prefix,
        "--port",
        str(port),
        "--gloo-addr",
        gloo[0],
        "--gloo-ifname",
        gloo[1],
        "--rounds",
        str(args.rounds),
        "--block-bytes",
        str(args.block_bytes),
        "--sizes",
        ",".join(map(str, sizes)),
    ]


def spawn_ranks(world: int, argv: Callable[[int, list[str]], list[str]], cfg: list[str]) -> list[dict]:
    """Start every rank's worker (argv wraps the command, e.g. into a namespace) and collect its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "benchmarks.transport.bench", "worker"]
    procs = [
        subprocess.Popen(
            argv(r, [*command, "--rank", str(r), "--world", str(world), *cfg]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    try:
        outs = [p.communicate(timeout=RANK_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            raise SystemExit(f"rank {r} of {world} failed:\n{err[-3000:]}")
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def summarize(per_rank: list[dict], world: int, sizes: tuple[int, ...]) -> dict:
    """Per size and implementation: the slowest rank's p50/p99 and the bus bandwidth at that p50."""
    doc: dict[str, dict] = {}
    for size in sizes:
        row: dict = {}
        for impl in IMPLS:
            cells = [r[str(size)][impl] for r in per_rank]
            p50 = max(c["p50"] for c in cells)
            row[impl] = {
                "p50_us": p50,
                "p99_us": max(c["p99"] for c in cells),
                "iterations": cells[0]["iterations"],
                "busbw_gbyte_s": busbw_gbyte_s(world, size, p50),
            }
        row["p50_ratio_vs_gloo"] = round(row["sparkring"]["p50_us"] / row["gloo"]["p50_us"], 4)
        doc[str(size)] = row
    return doc
