"""A tensor-parallel decode step in one CUDA graph: the ring vs NCCL-socket vs compute alone (device lane).

    python3 -m benchmarks.gpu_transport.decode [--worlds 2,4] [--layers 16] [--rounds 3] [--out FILE]

Writes FILE (default benchmarks/results/gpu_decode_step.json) and its plot, and appends the run
to FILE's history (gpu_decode_step-history.jsonl). With fewer GPUs than ranks start MPS first
(nvidia-cuda-mps-control -d); the results record how the ranks share the GPU (gpu_sharing) and
how NCCL was placed (nccl_placement: its own NCCL_HOSTID per rank on a shared GPU).

One step is what a TP rank does per decode token, reduced to its collectives and their GEMMs:
per layer, two row-parallel GEMMs ([batch, hidden/world] x [hidden/world, hidden], bf16: the
attention output and the MLP down projection), each followed by an all-reduce of the
[batch, hidden] bf16 partial sums, the residual added after each; L layers, batch 1 and 8,
hidden 4096 and 7168. The whole step is captured as one CUDA graph and replayed. Three peers
run the same graph: ``ring`` (transport.gpu, the spinning-kernel command ring over the tcp
fabric on loopback), ``nccl_socket`` (torch.distributed NCCL through its socket transport on
lo) and ``none`` (the all-reduces left out: the GEMMs alone). Each round runs the three in
turn, each in fresh processes, every shape in each. Per shape: step time p50/p99 (one replay
plus its synchronisation, on rank 0, median over rounds), and the collective time per step: a peer's
step p50 minus ``none``'s in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.gpu_transport.bench import gpu_sharing, nccl_env, quantiles, run_peer
from benchmarks.history import append_run, history_path
from benchmarks.provenance import RunProvenance, load_average

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("ring", "nccl_socket", "none")
BATCHES = (1, 8)
HIDDENS = (4096, 7168)


def shape_key(batch: int, hidden: int) -> str:
    return f"b{batch}_h{hidden}"


def rank_main(peer: str, rank: int, world: int, cfg: dict, queue: Any) -> None:
    """Every shape of one peer on one rank: capture the step, replay it, report step times."""
    try:
        import torch
        import torch.distributed as dist

        gpus = torch.cuda.device_count()
        torch.cuda.set_device(rank % gpus)
        gpu = comm = None
        if peer == "ring":
            from transport.comm import Communicator
            from transport.gpu import GpuCollectives
            from transport.topology import cable_geometry

            comm = Communicator(
                cable_geometry(rank, world, "127.77"), tcp_port=cfg["ring_port"], timeout_s=60
            )
            gpu = GpuCollectives(comm, arena_bytes=16 << 20)

            def all_reduce(t):
                return gpu.all_reduce(t)
        elif peer == "nccl_socket":
            os.environ.update(nccl_env("nccl_socket", rank, world, gpus))
            dist.init_process_group("nccl", rank=rank, world_size=world)

            def all_reduce(t):
                dist.all_reduce(t)
                return t
        else:

            def all_reduce(t):
                return t

        results: dict[str, Any] = {}
        for batch in BATCHES:
            for hidden in HIDDENS:
                results[shape_key(batch, hidden)] = _one_shape(
                    torch, all_reduce, rank, world, batch, hidden, cfg
                )
        if gpu is not None:
            results["progress_stats"] = gpu.stats()
            gpu.close()
            comm.close()
        if peer == "nccl_socket":
            dist.destroy_process_group()
        queue.put((rank, "ok", results))
    except BaseException as exc:
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _one_shape(torch, all_reduce, rank: int, world: int, batch: int, hidden: int, cfg: dict) -> dict:
    shard = hidden // world
    gen = torch.Generator(device="cuda").manual_seed(rank)
    scale = 1.0 / (hidden**0.5)
    weights = [
        (torch.randn(shard, hidden, generator=gen, device="cuda") * scale).bfloat16()
        for _ in range(2 * cfg["layers"])
    ]
    x = torch.randn(batch, hidden, generator=gen, device="cuda").bfloat16()
    lo = rank * shard

    def step():
        h = x
        for w in weights:  # attention output, then MLP down projection, per layer
            h = h + all_reduce(h[:, lo : lo + shard] @ w)
        return h

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture (registers the ring's plans, builds NCCL's)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(cfg["replays"]):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    finite = bool(torch.isfinite(out.float()).all().item())
    del graph
    return {"step": quantiles(times), "finite": finite, "all_reduces": 2 * cfg["layers"]}


def p50(res: dict, world: int, peer: str, key: str) -> float | None:
    vals = [
        r[str(world)][peer][key]["step"]["p50_us"] for r in res["rounds"] if peer in r.get(str(world), {})
    ]
    return sorted(vals)[len(vals) // 2] if vals else None


def collective_us(res: dict, world: int, peer: str, key: str) -> float | None:
    """The median over rounds of (peer's step p50 - compute alone's step p50), same round."""
    vals = [
        r[str(world)][peer][key]["step"]["p50_us"] - r[str(world)]["none"][key]["step"]["p50_us"]
        for r in res["rounds"]
        if peer in r.get(str(world), {})
    ]
    return round(sorted(vals)[len(vals) // 2], 2) if vals else None


def summarize(res: dict) -> dict:
    table: dict[str, Any] = {}
    for world in res["config"]["worlds"]:
        for batch in BATCHES:
            for hidden in HIDDENS:
                key = shape_key(batch, hidden)
                ring, nccl = (
                    collective_us(res, world, "ring", key),
                    collective_us(res, world, "nccl_socket", key),
                )
                table[f"w{world}_{key}"] = {
                    "step_p50_us": {p: p50(res, world, p, key) for p in PEERS},
                    "collective_us_per_step": {"ring": ring, "nccl_socket": nccl},
                    "collective_us_per_all_reduce": {
                        p: round(v / (2 * res["config"]["layers"]), 2) if v is not None else None
                        for p, v in (("ring", ring), ("nccl_socket", nccl))
                    },
                    "ring_collective_ratio_vs_nccl_socket": round(ring / nccl, 3) if ring and nccl else None,
                }
    w4b1 = [v["ring_collective_ratio_vs_nccl_socket"] for k, v in table.items() if k.startswith("w4_b1_")]
    return {
        "shapes": table,
        # Done means: at world 4, batch 1, the ring's collective time <= 0.5x NCCL-socket's (worse hidden).
        "w4_b1_collective_ratio_vs_nccl_socket": max(w4b1) if w4b1 and None not in w4b1 else None,
    }


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = res["config"]["worlds"]
    fig, axes = plt.subplots(1, len(worlds), figsize=(6 * len(worlds), 4.5), squeeze=False)
    keys = [shape_key(b, h) for b in BATCHES for h in HIDDENS]
    for ax, world in zip(axes[0], worlds, strict=True):
        width = 0.27
        for i, peer in enumerate(PEERS):
            ys = [p50(res, world, peer, k) or 0 for k in keys]
            ax.bar([j + (i - 1) * width for j in range(len(keys))], [y / 1000 for y in ys], width, label=peer)
        ax.set_xticks(range(len(keys)), keys)
        ax.set(
            ylabel="step p50 (ms, one graph replay)", title=f"world {world}: {res['config']['layers']} layers"
        )
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    sharing = "; ".join(f"world {w}: {how}" for w, how in res["gpu_sharing"].items())
    fig.suptitle(
        f"TP decode step in one CUDA graph, {res['machine']['gpus']}x {res['machine']['gpu']}; {sharing}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=200, help="timed graph replays per shape and round")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_decode_step.json")
    args = ap.parse_args()
    import torch

    from transport.gpu import nccl_placement

    start = RunProvenance.capture()
    gpus = torch.cuda.device_count()
    worlds = [int(w) for w in args.worlds.split(",")]
    cfg = {"layers": args.layers, "replays": args.replays}
    res: dict[str, Any] = {
        "schema": "sparkring.bench.gpu_decode_step/1",
        "machine": {
            "gpu": torch.cuda.get_device_name(0),
            "gpus": gpus,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        },
        "config": {
            "worlds": worlds,
            "layers": args.layers,
            "batches": list(BATCHES),
            "hiddens": list(HIDDENS),
            "dtype": "bfloat16",
            "replays": args.replays,
            "rounds": args.rounds,
            "step": "per layer 2 x (row-parallel GEMM [batch, hidden/world] x [hidden/world, hidden], "
            "all-reduce of [batch, hidden], residual add); one CUDA graph per step",
            "ring": {
                "fabric": "tcp",
                "geometry": "127.77.i.0/24 loopback",
                "reductions": "host cores",
                # None: the engine's default (transport/csrc/sr_engine.c)
                "SPARKRING_ENGINE_SPIN_US": os.environ.get("SPARKRING_ENGINE_SPIN_US"),
            },
        },
        "gpu_sharing": {str(w): gpu_sharing(w, gpus) for w in worlds},
        "nccl_placement": {str(w): nccl_placement(w, gpus) for w in worlds},
        "rounds_interleaved": True,
        "rounds": [],
    }
    for rnd in range(args.rounds):
        row: dict[str, Any] = {"load_avg": load_average()}
        for world in worlds:
            row[str(world)] = {}
            for peer in PEERS:
                print(f"round {rnd + 1}/{args.rounds}: world {world} {peer}", flush=True)
                row[str(world)][peer] = run_peer(peer, world, cfg, timeout_s=600, target=rank_main)
        res["rounds"].append(row)
    res.update(summarize(res))
    res["provenance"] = start.finish()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    append_run(history_path(args.out), res)  # every run kept beside the results file
    plot(res, args.out.with_suffix(".png"))
    print(
        json.dumps(
            {
                "w4_b1_collective_ratio_vs_nccl_socket": res["w4_b1_collective_ratio_vs_nccl_socket"],
                **{k: v["collective_us_per_step"] for k, v in res["shapes"].items()},
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
