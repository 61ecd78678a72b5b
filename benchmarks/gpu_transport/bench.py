"""GPU ring collectives vs NCCL: all-reduce latency, eager and CUDA-graph-replayed (device lane).

    python3 -m benchmarks.gpu_transport.bench [--world 2] [--rounds 3] [--variant-sweep] [--out FILE]

Writes FILE (default benchmarks/results/gpu_transport.json) and its plot, and appends the run
to FILE's history (gpu_transport-history.jsonl). With fewer GPUs than ranks, start MPS first
(nvidia-cuda-mps-control -d): without it the GPU time-slices between the rank processes and
the latencies measure that; the results record which (gpu_sharing).

Each round runs every peer once, in turn (ring, then NCCL over sockets, then NCCL over NVLink
where there is a GPU per rank), each in its own fresh set of processes (NCCL reads its settings
once per process), so a change of load lands on every side alike. Rank r runs on GPU r % count.
The ring is transport.gpu over the tcp fabric on the loopback cable geometry (127.77.i.0/24):
the command ring and the native progress thread, reductions on the host cores. "NCCL over
sockets" is NCCL forced through the host (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket
NCCL_SOCKET_IFNAME=lo): the nearest stand-in on this box for a NIC path. With fewer GPUs than
ranks each NCCL rank gets its own NCCL_HOSTID (transport.gpu.nccl_rank_env), so NCCL shares the
GPUs as the ring's ranks do; the results say how (gpu_sharing, nccl_placement).

Per size (fp16, 4 KB to 64 MB) and mode: p50/p99 of one call including its stream
synchronisation (eager), or of one graph replay plus synchronisation (graph); the host time of
graph.replay() alone. From 1 MiB the ring also runs whole copies (``_unpipelined``) and
pipelined copies (``_pipelined``, transport.plan.pipelined) wherever the default is the other,
and the reduce-scatter + all-gather schedule (``_rsag``: at two ranks half the host adds of the
default exchange, the same bytes on the wire; at four, the ring where the default up to 4 MiB is
the two matchings; and there the crossed matchings, ``_crossed``, both cables busy in each
round), right beside the default calls, in the same
processes, the order alternating by round: the before/after. For every ring call the progress
thread's own time is recorded beside it (``engine_<mode>``: the mean time per call it spent
running the plan, and the part of that a pipelined plan waited for the input copies), so the
rest of the latency (copies, posting, waking) shows. Then a correctness
run: graph replays of a captured 16 KB all-reduce with fresh random inputs, each result compared
bitwise with the engine's order computed by torch and with NCCL's own all-reduce of the same
inputs in the same processes (bitwise at 2 ranks; at 4 NCCL's ring order differs, so within the
two-orders envelope).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.history import append_run, history_path
from benchmarks.provenance import RunProvenance, load_average
from transport.fabric_tcp import DEFAULT_CONNECTIONS, DEFAULT_STRIPE_MIN_BYTES

ROOT = Path(__file__).resolve().parents[2]

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
PEERS = ("ring", "nccl_socket", "nccl_nvlink")
NCCL_ENV = {
    "nccl_socket": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_NET": "Socket",
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_NVLS_ENABLE": "0",
    },
    "nccl_nvlink": {"NCCL_NVLS_ENABLE": "0"},
}
OFF = 1 << 62  # a threshold no message reaches: the variant without that path
PIPELINE_FROM = 1 << 20  # the _pipelined variant pipelines every size from here; _rsag runs from here too


def nccl_env(peer: str, rank: int, world: int, gpus: int) -> dict[str, str]:
    """The peer's NCCL settings plus this rank's placement (its own NCCL_HOSTID on a shared GPU)."""
    from transport.gpu import nccl_rank_env

    return {**NCCL_ENV[peer], **nccl_rank_env(rank, world, gpus)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iterations(nbytes: int, base: int) -> int:
    return base if nbytes <= (1 << 20) else max(20, base // 10)


def quantiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50_us": round(s[len(s) // 2], 2),
        "p99_us": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2),
        "n": len(s),
    }


def _time_eager(op, sync, n: int) -> list[float]:
    out = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _time_graph(graph, sync, n: int) -> tuple[list[float], list[float]]:
    total, host = [], []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        sync()
        total.append((time.perf_counter() - t0) * 1e6)
        host.append((t1 - t0) * 1e6)
    return total, host


def _capture(torch, fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside capture (registers the ring's plan, builds NCCL's)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def rank_main(peer: str, rank: int, world: int, cfg: dict, queue: Any) -> None:
    """One rank of one peer: every size, eager then graph; rank 0 reports."""
    try:
        import torch
        import torch.distributed as dist

        gpus = torch.cuda.device_count()
        torch.cuda.set_device(rank % gpus)
        sync = torch.cuda.synchronize
        results: dict[str, Any] = {"sizes": {}}
        if peer == "ring":
            from transport.comm import Communicator
            from transport.gpu import GpuCollectives
            from transport.topology import cable_geometry

            comm = Communicator(
                cable_geometry(rank, world, "127.77"),
                tcp_port=cfg["ring_port"],
                timeout_s=60,
                connections=cfg["connections"],
                stripe_min_bytes=cfg["stripe_min_bytes"],
            )
            gpu = GpuCollectives(comm, arena_bytes=2 * max(SIZES) + 4096)
            # (fused_max_bytes, wait, pipeline_min_bytes, all-reduce algorithm)
            default = (gpu.fused_max_bytes, gpu.wait, gpu.pipeline_min_bytes, "auto")
            variants = {
                "": default,
                "_unpipelined": (gpu.fused_max_bytes, gpu.wait, OFF, "auto"),
                "_pipelined": (gpu.fused_max_bytes, gpu.wait, PIPELINE_FROM, "auto"),
            }
            variants["_rsag"] = (*default[:3], "ring")
            if world == 4:
                variants["_crossed"] = (*default[:3], "crossed")
            if cfg["variant_sweep"]:
                variants |= {
                    "_fused": (OFF, gpu.wait, OFF, "auto"),
                    "_copyengine": (0, gpu.wait, OFF, "auto"),
                    "_spin": (gpu.fused_max_bytes, "spin", gpu.pipeline_min_bytes, "auto"),
                }
            if cfg["round"] % 2:  # the before/after: which of the two goes first alternates
                variants = {k: variants.pop(k) for k in ("_unpipelined", "_pipelined")} | variants
            results["fused_max_bytes"], results["wait"], results["pipeline_min_bytes"] = default[:3]
        else:
            os.environ.update(nccl_env(peer, rank, world, gpus))
            dist.init_process_group("nccl", rank=rank, world_size=world)
            variants = {"": None}
        for nbytes in SIZES:
            x = torch.randn(nbytes // 2, device="cuda").half()
            n = iterations(nbytes, cfg["iters"])
            row: dict[str, Any] = {}
            for suffix, variant in variants.items():
                if peer == "ring":
                    if suffix == "_unpipelined" and nbytes < variants[""][2]:
                        continue  # below the default's threshold both are the same code
                    if suffix == "_pipelined" and not PIPELINE_FROM <= nbytes < variants[""][2]:
                        continue  # ... and from it, or below 1 MiB
                    if suffix in ("_rsag", "_crossed") and nbytes < PIPELINE_FROM:
                        continue
                    if suffix not in ("", "_unpipelined", "_pipelined", "_rsag", "_crossed") and nbytes > (
                        1 << 20
                    ):
                        continue
                    gpu.fused_max_bytes, gpu.wait, gpu.pipeline_min_bytes, algorithm = variant

                    def op(x=x, algorithm=algorithm):
                        return gpu.all_reduce(x, algorithm)
                else:

                    def op(x=x):
                        dist.all_reduce(x)
                        return x

                op()
                before = engine_counters(gpu) if peer == "ring" else None
                row["eager" + suffix] = quantiles(_time_eager(op, sync, n))
                if before is not None:
                    row["engine_eager" + suffix] = engine_time(before, engine_counters(gpu))
                graph, _ = _capture(torch, op)
                before = engine_counters(gpu) if peer == "ring" else None
                total, host = _time_graph(graph, sync, n)
                row["graph" + suffix] = quantiles(total)
                row["graph_replay_host" + suffix] = quantiles(host)
                if before is not None:
                    row["engine_graph" + suffix] = engine_time(before, engine_counters(gpu))
                del graph
            if peer == "ring":
                gpu.fused_max_bytes, gpu.wait, gpu.pipeline_min_bytes, _ = variants[""]
                row["pipelined"] = nbytes >= variants[""][2]
                if nbytes >= PIPELINE_FROM:  # the pipelined bytes are the whole copies' bytes
                    gpu.pipeline_min_bytes = PIPELINE_FROM
                    piped = gpu.all_reduce(x)
                    gpu.pipeline_min_bytes = OFF
                    whole = gpu.all_reduce(x)
                    gpu.pipeline_min_bytes = variants[""][2]
                    row["pipelined_equals_unpipelined"] = torch.equal(
                        piped.view(torch.int16), whole.view(torch.int16)
                    )
                    if world == 2:  # a0 + a1 in either schedule: the same bytes
                        rsag = gpu.all_reduce(x, "ring")
                        row["rsag_equals_exchange"] = torch.equal(
                            rsag.view(torch.int16), whole.view(torch.int16)
                        )
            results["sizes"][str(nbytes)] = row
        if peer == "ring":
            # NCCL joins only now, so its threads are not there while the ring is timed.
            os.environ.update(nccl_env("nccl_socket", rank, world, gpus))
            dist.init_process_group("nccl", rank=rank, world_size=world)
            results["check"] = _check_replays(torch, dist, gpu, rank, world, cfg["checks"])
            results["progress_stats"] = gpu.stats()
            results["link_stats"] = {str(peer): s for peer, s in comm.stats().items()}
            gpu.close()
            comm.close()
        dist.destroy_process_group()
        queue.put((rank, "ok", results))
    except BaseException as exc:
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def engine_counters(gpu) -> tuple[int, int, int]:
    """The progress thread's all-reduces answered, ns running plans, ns waiting for input."""
    stats = gpu.stats()
    return stats["all_reduce"], stats["plan_ns"], stats["input_wait_ns"]


def engine_time(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict:
    """Mean progress-thread time per call between two engine_counters readings."""
    calls = after[0] - before[0]
    return {
        "plan_us_mean": round((after[1] - before[1]) / calls / 1000, 2) if calls else None,
        "input_wait_us_mean": round((after[2] - before[2]) / calls / 1000, 2) if calls else None,
        "calls": calls,
    }


def _check_replays(torch, dist, gpu, rank: int, world: int, n: int) -> dict:
    """Replays of a captured 16 KB all-reduce with fresh inputs, each compared with NCCL's
    all-reduce of the same inputs (bitwise at 2 ranks; at 4 within the envelope of two fp16
    summation orders, as NCCL's ring adds in another order) and bitwise with the engine's order
    (exchange, or the two matchings) computed by torch from every rank's input."""
    static = torch.zeros(8192, dtype=torch.float16, device="cuda")
    graph, out = _capture(torch, lambda: gpu.all_reduce(static))

    def add(a, b):
        return (a.float() + b.float()).half()

    bad = bad_nccl = 0
    worst = 0.0
    eps = float(torch.finfo(torch.float16).eps)
    for i in range(n):
        xs = [
            torch.randn(
                8192, generator=torch.Generator(device="cuda").manual_seed(i * 8 + r), device="cuda"
            ).half()
            for r in range(world)
        ]
        static.copy_(xs[rank])
        graph.replay()
        nccl = xs[rank].clone()
        dist.all_reduce(nccl)
        torch.cuda.synchronize()
        want = add(xs[0], xs[1]) if world == 2 else add(add(xs[0], xs[1]), add(xs[2], xs[3]))
        bad += int(not torch.equal(out.view(torch.int16), want.view(torch.int16)))
        if world == 2:
            bad_nccl += int(not torch.equal(out.view(torch.int16), nccl.view(torch.int16)))
        else:
            err = (out.float() - nccl.float()).abs().max().item()
            bound = world * eps * 2 * nccl.float().abs().max().item()
            worst = max(worst, err / bound)
            bad_nccl += int(err > bound)
    gpu.check("replay check")
    return {
        "replays": n,
        "mismatches": bad + bad_nccl,
        "mismatches_vs_engine_order": bad,
        "mismatches_vs_nccl": bad_nccl,
        "nccl_compare": "bitwise"
        if world == 2
        else f"|ring - nccl| <= {world} * eps * 2 * max|sum| (worst {worst:.3f} of it)",
        "reference": "NCCL's all-reduce of the same inputs (NCCL socket placement) and the engine order by torch",
    }


def run_peer(peer: str, world: int, cfg: dict, timeout_s: float, target: Any = None) -> dict:
    """``target`` (default rank_main) as every rank of ``peer`` in fresh processes; rank 0's report."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # NCCL's: each rank sets its own
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    cfg = {**cfg, "ring_port": free_port()}
    procs = [ctx.Process(target=target or rank_main, args=(peer, r, world, cfg, queue)) for r in range(world)]
    for p in procs:
        p.start()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        got = dict((r, (s, v)) for r, s, v in (queue.get(timeout=timeout_s) for _ in procs))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    for r, (status, value) in got.items():
        if status != "ok":
            raise SystemExit(f"{peer} rank {r} failed:\n{value}")
    return got[0][1]


def gpu_sharing(world: int, gpus: int) -> str:
    """How the ranks share the GPUs, which decides what the latencies mean."""
    from transport.gpu import mps_active

    if gpus >= world:
        return "one GPU per rank"
    return "MPS (ranks run concurrently on each GPU)" if mps_active() else "time-sliced (no MPS)"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def p50(res: dict, peer: str, nbytes: int, mode: str) -> float | None:
    rounds = [r[peer]["sizes"][str(nbytes)].get(mode, {}).get("p50_us") for r in res["rounds"] if peer in r]
    rounds = [v for v in rounds if v is not None]
    return sorted(rounds)[len(rounds) // 2] if rounds else None


def worse_ratio(res: dict, nbytes: int, suffix: str = "") -> float | None:
    """The worse of eager and graph against NCCL-socket: a target holds for both or it does not."""
    eager = ratio(p50(res, "ring", nbytes, "eager" + suffix), p50(res, "nccl_socket", nbytes, "eager"))
    graph = ratio(p50(res, "ring", nbytes, "graph" + suffix), p50(res, "nccl_socket", nbytes, "graph"))
    return max(eager, graph) if eager and graph else None


def headline(res: dict) -> dict:
    k16 = 16 << 10
    ring_rounds = [r["ring"] for r in res["rounds"]]
    host = sorted(r["sizes"][str(k16)]["graph_replay_host"]["p50_us"] for r in ring_rounds)
    return {
        "graph_allreduce_16k_p50_ratio_vs_nccl_socket": ratio(
            p50(res, "ring", k16, "graph"), p50(res, "nccl_socket", k16, "graph")
        ),
        "eager_allreduce_16k_p50_ratio_vs_nccl_socket": ratio(
            p50(res, "ring", k16, "eager"), p50(res, "nccl_socket", k16, "eager")
        ),
        "allreduce_4m_p50_ratio_vs_nccl_socket": worse_ratio(res, 4 << 20),
        "allreduce_64m_p50_ratio_vs_nccl_socket": worse_ratio(res, 64 << 20),
        # The same two for the whole copies (the code before the pipeline), timed beside them.
        "allreduce_4m_p50_ratio_vs_nccl_socket_unpipelined": worse_ratio(res, 4 << 20, "_unpipelined"),
        "allreduce_64m_p50_ratio_vs_nccl_socket_unpipelined": worse_ratio(res, 64 << 20, "_unpipelined"),
        "allreduce_4m_p50_ratio_vs_nccl_socket_pipelined": worse_ratio(res, 4 << 20, "_pipelined"),
        # Two ranks only: the reduce-scatter + all-gather schedule instead of the exchange.
        "allreduce_4m_p50_ratio_vs_nccl_socket_rsag": worse_ratio(res, 4 << 20, "_rsag"),
        "allreduce_64m_p50_ratio_vs_nccl_socket_rsag": worse_ratio(res, 64 << 20, "_rsag"),
        "allreduce_4m_p50_ratio_vs_nccl_socket_crossed": worse_ratio(res, 4 << 20, "_crossed"),
        "graph_replay_host_us_p50": host[len(host) // 2],
        "graph_replays_checked": sum(r["check"]["replays"] for r in ring_rounds),
        "graph_replay_mismatches": sum(r["check"]["mismatches"] for r in ring_rounds),
        "graph_replay_mismatches_vs_nccl": sum(r["check"]["mismatches_vs_nccl"] for r in ring_rounds),
    }


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, mode in zip(axes, ("eager", "graph"), strict=True):
        variants = [("ring", s) for s in ("_unpipelined", "_pipelined", "_rsag", "_crossed")]
        for peer, suffix in [(p, "") for p in PEERS] + variants:
            ys = [p50(res, peer, n, mode + suffix) for n in SIZES]
            if any(y is not None for y in ys):
                ax.plot(
                    [n / 1024 for n in SIZES],
                    ys,
                    marker="o",
                    label=peer + suffix,
                    linestyle="--" if suffix else "-",
                )
        ax.set(xscale="log", yscale="log", xlabel="all-reduce size (KiB, fp16)", title=f"{mode}: p50 latency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("microseconds (median of rounds)")
    fig.suptitle(
        f"world {res['config']['world']}, {res['machine']['gpus']}x {res['machine']['gpu']}; "
        f"{res['gpu_sharing']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=300, help="calls per size up to 1 MB (fewer above)")
    ap.add_argument("--checks", type=int, default=3334, help="checked graph replays per round")
    ap.add_argument(
        "--variant-sweep",
        action="store_true",
        help="also time the ring's fused, copy-engine and spinning-kernel variants up to 1 MB",
    )
    ap.add_argument(
        "--connections", type=int, default=DEFAULT_CONNECTIONS, help="the ring's TCP connections per link"
    )
    ap.add_argument(
        "--stripe-min-bytes",
        type=int,
        default=DEFAULT_STRIPE_MIN_BYTES,
        help="with several connections, the fewest bytes a transfer is striped over them from",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_transport.json")
    args = ap.parse_args()
    import torch

    start = RunProvenance.capture()
    gpus = torch.cuda.device_count()
    from transport.gpu import nccl_placement

    peers = ["ring", "nccl_socket"] + (["nccl_nvlink"] if gpus >= args.world else [])
    cfg = {
        "iters": args.iters,
        "checks": args.checks,
        "variant_sweep": args.variant_sweep,
        "connections": args.connections,
        "stripe_min_bytes": args.stripe_min_bytes,
    }
    res: dict[str, Any] = {
        "machine": {
            "gpu": torch.cuda.get_device_name(0),
            "gpus": gpus,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        },
        "config": {
            "world": args.world,
            "dtype": "float16",
            "sizes": SIZES,
            "rounds": args.rounds,
            "ring": {
                "fabric": "tcp",
                "geometry": "127.77.i.0/24 loopback",
                "reductions": "host cores (progress thread)",
                "connections_per_link": args.connections,
                "stripe_min_bytes": args.stripe_min_bytes if args.connections > 1 else None,
                # None: the engine's default (transport/csrc/sr_engine.c)
                "SPARKRING_ENGINE_SPIN_US": os.environ.get("SPARKRING_ENGINE_SPIN_US"),
            },
            "nccl_socket_env": NCCL_ENV["nccl_socket"],
            "nccl_nvlink_env": NCCL_ENV["nccl_nvlink"],
            "peers_run": peers,
        },
        "gpu_sharing": gpu_sharing(args.world, gpus),
        "nccl_placement": nccl_placement(args.world, gpus),
        "not_run": {}
        if gpus >= args.world
        else {"nccl_nvlink": f"NVLink needs a GPU per rank: {args.world} ranks, {gpus} GPU(s) lent"},
        "rounds_interleaved": True,
        "rounds": [],
    }
    for rnd in range(args.rounds):
        row: dict[str, Any] = {"load_avg": load_average()}
        for peer in peers:
            print(f"round {rnd + 1}/{args.rounds}: {peer}", flush=True)
            row[peer] = run_peer(peer, args.world, {**cfg, "round": rnd}, timeout_s=900)
        res["rounds"].append(row)
    res.update(headline(res))
    res["provenance"] = start.finish()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    append_run(history_path(args.out), res)  # every run kept beside the results file
    plot(res, args.out.with_suffix(".png"))
    print(json.dumps({k: res[k] for k in headline(res)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
