"""Ring transport benchmark: SparkRing's tcp fabric against torch.distributed gloo, same links, same run.

    sudo .venv/bin/python benchmarks/transport/bench.py run      # -> benchmarks/results/transport.json + .png
    sudo .venv/bin/python benchmarks/transport/bench.py burn --iters 1000000   # 16 KB all-reduce burn

Both build a private four-namespace ring (tp-bench-r*, veth cables, MTU 9000, the sim's
geometry on 10.78.i.0/24) and delete it afterwards. ``run`` measures, in order:

1. all-reduce p50/p99 at 1 KB, 16 KB and 1 MB (fp32), unshaped: SparkRing with forwarding
   off (only ring links exist), then gloo;
2. every ring interface shaped with tc tbf (--rate, 500 Mbit/s by default) so the link and
   not the two shared CPUs is the limit (SparkRing's ring loads both directions of all four
   cables, 8 x rate through one kernel); iperf3 on one shaped link gives the physical limit;
3. 64 MB all-reduce bus bandwidth (2(N-1)/N x bytes / time) for SparkRing, then gloo.
   SparkRing's ring runs two half-rings in opposite directions, so with full-duplex links
   its bus bandwidth can reach twice the one-way rate iperf3 measures.

gloo connects every pair of ranks, which a switchless ring cannot do, so for gloo the
ranks forward for each other (routes to the diagonal cables through a neighbour); each
gloo rank binds the address on its left cable, so gloo's ring traffic between neighbours
takes the direct link. ``burn`` runs the probe's all-reduce burn in every namespace and
writes benchmarks/results/transport_burn.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from transport import netns, schedule
from transport.topology import cable_geometry

ROOT = Path(__file__).resolve().parents[2]

PREFIX = "10.78"
WORLD = 4
SIZES = (1024, 16384, 1 << 20)
BIG = 64 << 20
RESULTS = ROOT / "benchmarks" / "results"


def _pct(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50": round(s[len(s) // 2], 2), "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2)}


# -- workers (one per rank, inside its namespace) ------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """Time all-reduces for one rank and print JSON: latency per size, or bus bandwidth."""
    import numpy as np

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spec = cable_geometry(args.rank, WORLD, PREFIX)
    sizes = [BIG] if args.mode == "busbw" else list(SIZES)
    if args.impl == "sparkring":
        from transport.comm import Communicator

        comm = Communicator(spec, tcp_port=args.port, timeout_s=120)

        def all_reduce(x: np.ndarray) -> np.ndarray:
            return comm.all_reduce(x, out=x)  # in place, as gloo does
    else:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        left = spec.port_to(spec.left)  # bind the left cable: gloo's ring sends rank r -> r+1
        os.environ["GLOO_SOCKET_IFNAME"] = f"ring{left.cage}"
        head = cable_geometry(0, WORLD, PREFIX).port_to(WORLD - 1).address
        dist.init_process_group(
            "gloo", init_method=f"tcp://{head}:{args.port}", rank=args.rank, world_size=WORLD
        )

        def all_reduce(x: np.ndarray) -> np.ndarray:
            dist.all_reduce(torch.from_numpy(x))
            return x

    out: dict[str, dict] = {}
    for size in sizes:
        n = size // 4
        x = np.full(n, args.rank + 1, dtype=np.float32)  # small integers: every sum is exact
        iters = args.iters if size < (1 << 20) else max(5, args.iters // 20)
        if size == BIG:
            iters = args.big_iters
        y = x.copy()  # one buffer, touched once: fresh pages are slow here and not what we measure
        times = []
        for i in range(iters + 3):
            np.copyto(y, x)
            t0 = time.perf_counter()
            y = all_reduce(y)
            if i >= 3:  # warm-up
                times.append((time.perf_counter() - t0) * 1e6)
            if y[0] != 10 or y[-1] != 10:
                raise SystemExit(f"{args.impl} all-reduce of {size} B returned {y[0]}, expected 10")
        out[str(size)] = {"iterations": iters, **_pct(times), "mean": round(statistics.fmean(times), 2)}
    print(json.dumps(out))


def _spawn_ranks(
    ring: netns.NetnsRing, impl: str, mode: str, port: int, iters: int, big_iters: int
) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            ring.exec_argv(r, [sys.executable, __file__, "worker", impl, mode, "--rank", str(r), "--port", str(port),
                               "--iters", str(iters), "--big-iters", str(big_iters)]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for r in range(WORLD)
    ]  # fmt: skip
    outs = [p.communicate(timeout=900) for p in procs]
    for r, (p, (_, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            raise SystemExit(f"{impl} {mode} rank {r} failed:\n{err[-3000:]}")
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def _summary(per_rank: list[dict], size: int) -> dict:
    """The slowest rank's figures: a collective is as fast as its slowest member."""
    rows = [r[str(size)] for r in per_rank]
    return {"p50_us": max(r["p50"] for r in rows), "p99_us": max(r["p99"] for r in rows),
            "iterations": rows[0]["iterations"]}  # fmt: skip


def _iperf3(ring: netns.NetnsRing, seconds: int) -> float:
    a, b = (
        cable_geometry(0, WORLD, PREFIX).ports[0].address,
        cable_geometry(1, WORLD, PREFIX).ports[0].address,
    )
    server = subprocess.Popen(ring.exec_argv(1, ["iperf3", "-s", "-1", "-B", b, "-p", "5201"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.5)
        out = subprocess.run(ring.exec_argv(0, ["iperf3", "-c", b, "-B", a, "-p", "5201", "-t", str(seconds), "-J"]),
                             capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        server.wait(timeout=30)
    return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def run(args: argparse.Namespace) -> None:
    why = netns.available()
    if why:
        raise SystemExit(f"cannot benchmark here: {why}")
    ring = netns.NetnsRing("tp-bench", WORLD, PREFIX)
    ring.destroy()  # a leftover from an interrupted run
    ring.create()
    started, load_start = datetime.datetime.now(datetime.UTC), os.getloadavg()[0]
    try:
        lat_ours = _spawn_ranks(ring, "sparkring", "latency", 28800, args.iters, args.big_iters)
        ring.shape(args.rate)
        link = _iperf3(ring, args.iperf_seconds)
        bw_ours = _spawn_ranks(ring, "sparkring", "busbw", 28801, args.iters, args.big_iters)
        ring.route_diagonals()
        bw_gloo = _spawn_ranks(ring, "gloo", "busbw", 28802, args.iters, args.big_iters)
        ring.unshape()
        lat_gloo = _spawn_ranks(ring, "gloo", "latency", 28803, args.iters, args.big_iters)
    finally:
        ring.destroy()
    factor = 2 * (WORLD - 1) / WORLD

    def busbw(per_rank: list[dict]) -> float:
        return round(factor * BIG * 8 / (max(r[str(BIG)]["p50"] for r in per_rank) * 1e-6) / 1e9, 4)

    doc = {
        "schema": "sparkring.bench.transport/1",
        "started_utc": started.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": os.uname().release,
                    "load_avg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}},
        "ring": {"world": WORLD, "links": "veth in private network namespaces, MTU 9000", "prefix": PREFIX,
                 "shaped_rate": args.rate, "fabric": "tcp"},
        "sparkring_algorithms": {str(s): schedule.allreduce_algorithm(WORLD, s) for s in (*SIZES, BIG)},
        "allreduce_latency_fp32": {
            "sparkring": {str(s): _summary(lat_ours, s) for s in SIZES},
            "gloo": {str(s): _summary(lat_gloo, s) for s in SIZES},
        },
        "iperf3_link_gbit_s": round(link, 4),
        "busbw_64m_gbit_s": {"sparkring": busbw(bw_ours), "gloo": busbw(bw_gloo)},
        "busbw_64m_iterations": args.big_iters,
        "notes": "latency unshaped; bandwidth with every ring interface shaped by tc tbf; p50/p99 are the "
                 "slowest rank's; gloo needs every pair, so its ranks forward for each other; SparkRing's ring "
                 "sends half the buffer each way round, so busbw / link can reach 2 on full-duplex links "
                 "(busbw_64m_ratio_vs_link / 2 is the share of each link direction used); the shaped rate is "
                 "chosen so the link, not the two shared cores, limits: the two half-rings push 8 x rate "
                 "through one kernel",
    }  # fmt: skip
    ours16, gloo16 = (
        doc["allreduce_latency_fp32"]["sparkring"]["16384"],
        doc["allreduce_latency_fp32"]["gloo"]["16384"],
    )
    doc["allreduce_16k_p50_ratio_vs_gloo"] = round(ours16["p50_us"] / gloo16["p50_us"], 4)
    doc["busbw_64m_ratio_vs_link"] = round(
        doc["busbw_64m_gbit_s"]["sparkring"] / doc["iperf3_link_gbit_s"], 4
    )
    doc["gloo_busbw_64m_ratio_vs_link"] = round(
        doc["busbw_64m_gbit_s"]["gloo"] / doc["iperf3_link_gbit_s"], 4
    )
    doc["targets"] = {"allreduce_16k_p50_ratio_vs_gloo": "<= 0.5", "busbw_64m_ratio_vs_link": ">= 0.85"}
    doc["targets_met"] = {"allreduce_16k_p50_ratio_vs_gloo": doc["allreduce_16k_p50_ratio_vs_gloo"] <= 0.5,
                          "busbw_64m_ratio_vs_link": doc["busbw_64m_ratio_vs_link"] >= 0.85}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "transport.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, RESULTS / "transport.png")
    print(json.dumps(doc, indent=2))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = ["1 KB", "16 KB", "1 MB"]
    for i, impl in enumerate(("sparkring", "gloo")):
        rows = [doc["allreduce_latency_fp32"][impl][str(s)] for s in SIZES]
        xs = [j + (i - 0.5) * 0.38 for j in range(len(SIZES))]
        ax1.bar(xs, [r["p50_us"] for r in rows], 0.38, label=f"{impl} p50")
        ax1.scatter(xs, [r["p99_us"] for r in rows], marker="_", s=200, color="black")
    ax1.set_xticks(range(len(SIZES)), labels)
    ax1.set_yscale("log")
    ax1.set_ylabel("all-reduce latency, us (bar p50, tick p99)")
    ax1.set_title("4-rank fp32 all-reduce, unshaped veth ring")
    ax1.legend()
    names = ["sparkring", "gloo", "iperf3 link"]
    vals = [doc["busbw_64m_gbit_s"]["sparkring"], doc["busbw_64m_gbit_s"]["gloo"], doc["iperf3_link_gbit_s"]]
    ax2.bar(names, vals, color=["C0", "C1", "grey"])
    link = doc["iperf3_link_gbit_s"]
    ax2.axhline(2 * link, color="grey", linestyle=":", label="2 x link: both directions full")
    ax2.axhline(0.85 * link, color="red", linestyle="--", label="target 0.85 x link")
    ax2.set_ylim(0, 2.4 * link)
    ax2.legend(loc="upper right")
    ax2.set_ylabel("Gbit/s")
    ax2.set_title(f"64 MB all-reduce bus bandwidth, links shaped to {doc['ring']['shaped_rate']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def burn(args: argparse.Namespace) -> None:
    """The 16 KB all-reduce burn: every result compared byte for byte with the reference."""
    why = netns.available()
    if why:
        raise SystemExit(f"cannot burn here: {why}")
    ring = netns.NetnsRing("tp-burn", WORLD, PREFIX)
    ring.destroy()
    ring.create()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "transport", "probe", "--world", str(WORLD), "--ring-prefix", PREFIX, "--skip-links",
           "--burn", "all_reduce", "--burn-dtype", args.dtype, "--burn-size", str(args.size), "--burn-iters",
           str(args.iters), "--timeout", "30"]  # fmt: skip
    started, load_start, t0 = datetime.datetime.now(datetime.UTC), os.getloadavg()[0], time.monotonic()
    try:
        procs = [subprocess.Popen(ring.exec_argv(r, [*cmd, "--rank", str(r)]), stdout=subprocess.PIPE, text=True,
                                  env=env) for r in range(WORLD)]  # fmt: skip
        docs = [json.loads(p.communicate()[0]) for p in procs]
    finally:
        ring.destroy()
    summary = {"schema": "sparkring.bench.transport_burn/1", "ok": all(d["ok"] for d in docs),
               "started_utc": started.isoformat(timespec="seconds"), "seconds": round(time.monotonic() - t0, 1),
               "load_avg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
               "errors": [d["error"] for d in docs if d["error"]], "ranks": [d["burns"] for d in docs],
               "mismatches": sum(b["mismatches"] for d in docs for b in d["burns"])}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "transport_burn.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if not summary["ok"]:
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="latency and bus bandwidth vs gloo -> benchmarks/results/transport.json")
    r.add_argument(
        "--rate",
        default="500mbit",
        help="tc tbf rate of every ring link (low enough that the link, not two shared CPUs, limits)",
    )
    r.add_argument("--iters", type=int, default=2000, help="iterations per small size (1 MB gets 1/20)")
    r.add_argument("--big-iters", type=int, default=6, help="64 MB iterations")
    r.add_argument("--iperf-seconds", type=int, default=5)
    b = sub.add_parser("burn", help="the all-reduce burn -> benchmarks/results/transport_burn.json")
    b.add_argument("--iters", type=int, default=1_000_000)
    b.add_argument("--size", type=int, default=16384)
    b.add_argument("--dtype", default="float32")
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("impl", choices=("sparkring", "gloo"))
    w.add_argument("mode", choices=("latency", "busbw"))
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--iters", type=int, required=True)
    w.add_argument("--big-iters", type=int, required=True)
    args = p.parse_args()
    {"run": run, "burn": burn, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
