"""Ring transport benchmark: SparkRing's tcp fabric against torch.distributed gloo, same links, same run.

    .venv/bin/python -m benchmarks.transport.bench host      # -> benchmarks/results/transport_host.json + .png
    sudo .venv/bin/python -m benchmarks.transport.bench run  # -> benchmarks/results/transport.json + .png
    sudo .venv/bin/python -m benchmarks.transport.bench burn --iters 1000000   # 16 KB all-reduce burn
    .venv/bin/python -m benchmarks.transport.bench replot benchmarks/results/transport_host.json

Every rank process holds a SparkRing communicator and a gloo process group at once, and for
each size the two take turns (rounds of SparkRing then gloo, then gloo then SparkRing, ...),
so a change of load during the run lands on both. A figure is the slowest rank's p50 (a
collective is as fast as its slowest member); bus bandwidth is 2(N-1)/N x bytes / p50. Every
run is appended whole to a history beside the results file (x.json -> x-history.jsonl); the
results file is the latest run plus every kept run's headline figures, commit, time and load.

``host`` (no root; needs numpy, torch for gloo, and a C compiler; matplotlib only for the
plot): the engine's own limit. The ranks are processes on this machine's loopback on the
inventory's cable geometry (127.77.i.0/24), unshaped, at 2 and 4 ranks, fp32 from 16 KB to
64 MB. gloo binds ``lo``; loopback reaches every pair, which gloo needs and a switchless ring
does not have.

``run`` (root): the sim's geometry in a private four-namespace ring (tp-bench-r*, veth
cables, MTU 9000, 10.78.i.0/24) that it deletes afterwards. The ranks forward for each other
(routes to the diagonal cables through a neighbour) because gloo needs every pair;
SparkRing only ever talks to its neighbours. It measures all-reduce latency at 1 KB, 16 KB
and 1 MB unshaped; then, with every ring interface shaped by tc tbf (--rate, 500 Mbit/s by
default, so the link and not the two shared CPUs is the limit: SparkRing's ring loads both
directions of all four cables, 8 x rate through one kernel), iperf3 on one cable in both
directions at once (--bidir) as the reference, and 64 MB bus bandwidth. SparkRing's two
half-rings run in opposite directions, so its bus bandwidth can reach that two-way sum. gloo
rank r binds the address on its left cable, so its ring traffic between neighbours takes the
direct link.

``burn`` runs the probe's all-reduce burn in every namespace and writes
benchmarks/results/transport_burn.json (every burn kept in its history, a failed one too).
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
from pathlib import Path

from benchmarks.history import append_run, history_path, load_runs
from benchmarks.provenance import RunProvenance
from transport import netns, schedule
from transport.topology import cable_geometry

ROOT = Path(__file__).resolve().parents[2]

IMPLS = ("sparkring", "gloo")
RESULTS = ROOT / "benchmarks" / "results"
NETNS_PREFIX, HOST_PREFIX = "10.78", "127.77"
NETNS_WORLD = 4
NETNS_SIZES = (1024, 16384, 1 << 20)
BIG = 64 << 20
HOST_SIZES = tuple(16384 << (2 * i) for i in range(7))  # 16 KB, 64 KB, ... 64 MB
HOST_WORLDS = (2, 4)
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


# -- the rank (one process per rank; in its namespace for `run`) -----------------------------


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


def spawn_ranks(world: int, argv: Callable[[int, list[str]], list[str]], cfg: list[str]) -> list[dict]:
    """Start every rank's worker (argv wraps the command, e.g. into a namespace) and collect its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(argv(r, [sys.executable, "-m", "benchmarks.transport.bench", "worker", "--rank", str(r),
                                  "--world", str(world), *cfg]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in range(world)
    ]  # fmt: skip
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
            row[impl] = {"p50_us": p50, "p99_us": max(c["p99"] for c in cells),
                         "iterations": cells[0]["iterations"], "busbw_gbyte_s": busbw_gbyte_s(world, size, p50)}  # fmt: skip
        row["p50_ratio_vs_gloo"] = round(row["sparkring"]["p50_us"] / row["gloo"]["p50_us"], 4)
        doc[str(size)] = row
    return doc


def _worker_cfg(
    args: argparse.Namespace, sizes: tuple[int, ...], prefix: str, port: int, gloo: tuple[str, str]
) -> list[str]:
    return ["--prefix", prefix, "--port", str(port), "--gloo-addr", gloo[0], "--gloo-ifname", gloo[1],
            "--rounds", str(args.rounds), "--block-bytes", str(args.block_bytes),
            "--sizes", ",".join(map(str, sizes))]  # fmt: skip


def _kept_run(run: dict, headline: tuple[str, ...]) -> dict:
    """One kept run's headline figures with its commit, time and load; a run seeded from git
    (recorded before provenance) says where it came from instead."""
    figures = {k: run.get(k) for k in headline}
    if "seeded_from" in run:
        return {"seeded_from": run["seeded_from"], "started_utc": run.get("started_utc"), **figures}
    prov = run["provenance"]
    return {"started_utc": prov["started_utc"], "git_commit": prov["git_commit"], "cpu_cores": prov["cpu_cores"],
            "load_avg_1m": [prov["load_avg_start"]["1m"], prov["load_avg_end"]["1m"]], **figures}  # fmt: skip


def _write(doc: dict, out: Path, headline: tuple[str, ...], draw: bool = True) -> None:
    """Append the run to the history beside ``out`` (every run is kept), then write ``out``: this
    run, plus each kept run's headline figures."""
    history = history_path(out)
    append_run(history, doc)
    doc["history"] = {"file": history.name, "runs": [_kept_run(run, headline) for run in load_runs(history)]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    if draw:
        plot(out)


def plot(results: Path) -> None:
    """Draw results.png beside a results file (either mode); without matplotlib, say how to later."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot; draw it elsewhere with `bench.py replot {results}`")
        return
    matplotlib.use("Agg")
    doc = json.loads(results.read_text())
    (plot_host if doc["schema"].startswith("sparkring.bench.transport_host/") else plot_run)(
        doc, results.with_suffix(".png")
    )


# -- host: unshaped loopback, 2 and 4 ranks ------------------------------------------------


def host(args: argparse.Namespace) -> None:
    start, t0 = RunProvenance.capture(), time.monotonic()
    worlds = {}
    for i, world in enumerate(args.worlds):
        cfg = _worker_cfg(args, args.sizes, HOST_PREFIX, args.port + 10 * i, ("127.0.0.1", "lo"))
        per_rank = spawn_ranks(world, lambda r, argv: argv, cfg)
        worlds[str(world)] = {
            "sparkring_algorithms": {str(s): schedule.allreduce_algorithm(world, s) for s in args.sizes},
            "allreduce_fp32": summarize(per_rank, world, args.sizes),
        }
    doc: dict = {
        "schema": "sparkring.bench.transport_host/1",
        "provenance": start.finish(),
        "seconds": round(time.monotonic() - t0, 1),
        "setup": {"links": "loopback, the inventory's cable geometry on 127.77.i.0/24, unshaped", "fabric": "tcp",
                  "dtype": "float32", "rounds": args.rounds, "block_bytes": args.block_bytes,
                  "gloo": "torch.distributed gloo on lo, every pair connected"},
        "worlds": worlds,
        "notes": "per size, SparkRing and gloo take turns in the same processes (rounds alternate which goes "
                 "first); p50/p99 are the slowest rank's; busbw = 2(N-1)/N x bytes / p50",
    }  # fmt: skip
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
    targets = {
        "busbw_64m_ratio_vs_gloo_w2": 1.0,
        "busbw_64m_ratio_vs_gloo_w4": 1.0,
        "p50_16k_ratio_vs_gloo_w4": 0.5,
    }
    doc["targets"] = {k: (">= " if k.startswith("busbw") else "<= ") + str(v) for k, v in targets.items()}
    doc["targets_met"] = {
        k: (doc[k] >= v if k.startswith("busbw") else doc[k] <= v) for k, v in targets.items() if k in doc
    }
    _write(doc, Path(args.out), tuple(k for k in doc if "_ratio_vs_gloo_w" in k))


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
    fig.suptitle(f"host path, unshaped loopback: {p['cpu_cores']} cores ({p['cpu_model']}), load "
                 f"{p['load_avg_start']['1m']}-{p['load_avg_end']['1m']}, {p['started_utc']}", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- run: the sim's geometry in private namespaces, shaped for bandwidth ------------------------


def _iperf3_bidir(ring: netns.NetnsRing, seconds: int) -> dict[str, float]:
    """iperf3 on cable 0 in both directions at once: each direction's and the summed Gbit/s."""
    a, b = (cable_geometry(r, NETNS_WORLD, NETNS_PREFIX).port_to(1 - r).address for r in (0, 1))
    server = subprocess.Popen(ring.exec_argv(1, ["iperf3", "-s", "-1", "-B", b, "-p", "5201"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.5)
        out = subprocess.run(
            ring.exec_argv(0, ["iperf3", "-c", b, "-B", a, "-p", "5201", "-t", str(seconds), "--bidir", "-J"]),
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        server.wait(timeout=30)
    end = json.loads(out.stdout)["end"]
    fwd = end["sum_received"]["bits_per_second"] / 1e9
    rev = end["sum_received_bidir_reverse"]["bits_per_second"] / 1e9
    return {"forward": round(fwd, 4), "reverse": round(rev, 4), "both": round(fwd + rev, 4)}


def run(args: argparse.Namespace) -> None:
    why = netns.available()
    if why:
        raise SystemExit(f"cannot benchmark here: {why}")
    ring = netns.NetnsRing("tp-bench", NETNS_WORLD, NETNS_PREFIX)
    ring.destroy()  # a leftover from an interrupted run
    ring.create()
    start = RunProvenance.capture()
    head = (cable_geometry(0, NETNS_WORLD, NETNS_PREFIX).port_to(NETNS_WORLD - 1).address, "")
    try:
        ring.route_diagonals()
        lat = spawn_ranks(
            NETNS_WORLD, ring.exec_argv, _worker_cfg(args, NETNS_SIZES, NETNS_PREFIX, 28800, head)
        )
        ring.shape(args.rate)
        link = _iperf3_bidir(ring, args.iperf_seconds)
        bw = spawn_ranks(NETNS_WORLD, ring.exec_argv, _worker_cfg(args, (BIG,), NETNS_PREFIX, 28810, head))
    finally:
        ring.destroy()
    latency, busbw = summarize(lat, NETNS_WORLD, NETNS_SIZES), summarize(bw, NETNS_WORLD, (BIG,))[str(BIG)]
    gbit = {impl: round(busbw[impl]["busbw_gbyte_s"] * 8, 4) for impl in IMPLS}
    doc = {
        "schema": "sparkring.bench.transport/2",
        "provenance": start.finish(),
        "ring": {"world": NETNS_WORLD, "links": "veth in private network namespaces, MTU 9000", "prefix": NETNS_PREFIX,
                 "shaped_rate": args.rate, "fabric": "tcp", "forwarding": "on (gloo needs every pair)",
                 "rounds": args.rounds, "block_bytes": args.block_bytes},
        "sparkring_algorithms": {str(s): schedule.allreduce_algorithm(NETNS_WORLD, s) for s in (*NETNS_SIZES, BIG)},
        "allreduce_latency_fp32": latency,
        "iperf3_bidir_gbit_s": link,
        "busbw_64m_gbit_s": gbit,
        "busbw_64m_iterations": busbw["sparkring"]["iterations"],
        "notes": "per size, SparkRing and gloo take turns in the same processes; latency unshaped; bandwidth with "
                 "every ring interface shaped by tc tbf; p50/p99 are the slowest rank's; the reference is iperf3 "
                 "on one cable in both directions at once, which SparkRing's two half-rings can fill; the rate is "
                 "low enough that the link, not the two shared cores, limits: the half-rings push 8 x rate through "
                 "one kernel",
    }  # fmt: skip
    doc["allreduce_16k_p50_ratio_vs_gloo"] = latency["16384"]["p50_ratio_vs_gloo"]
    doc["busbw_64m_ratio_vs_bidir_link"] = round(gbit["sparkring"] / link["both"], 4)
    doc["gloo_busbw_64m_ratio_vs_bidir_link"] = round(gbit["gloo"] / link["both"], 4)
    doc["targets"] = {"allreduce_16k_p50_ratio_vs_gloo": "<= 0.5", "busbw_64m_ratio_vs_bidir_link": ">= 0.85"}
    doc["targets_met"] = {"allreduce_16k_p50_ratio_vs_gloo": doc["allreduce_16k_p50_ratio_vs_gloo"] <= 0.5,
                          "busbw_64m_ratio_vs_bidir_link": doc["busbw_64m_ratio_vs_bidir_link"] >= 0.85}  # fmt: skip
    _write(doc, Path(args.out), ("allreduce_16k_p50_ratio_vs_gloo", "busbw_64m_ratio_vs_bidir_link"))


def plot_run(doc: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, impl in enumerate(IMPLS):
        rows = [doc["allreduce_latency_fp32"][str(s)][impl] for s in NETNS_SIZES]
        xs = [j + (i - 0.5) * 0.38 for j in range(len(NETNS_SIZES))]
        ax1.bar(xs, [r["p50_us"] for r in rows], 0.38, label=f"{impl} p50")
        ax1.scatter(xs, [r["p99_us"] for r in rows], marker="_", s=200, color="black")
    ax1.set_xticks(range(len(NETNS_SIZES)), ["1 KB", "16 KB", "1 MB"])
    ax1.set_yscale("log")
    ax1.set_ylabel("all-reduce latency, us (bar p50, tick p99)")
    ax1.set_title("4-rank fp32 all-reduce, unshaped veth ring")
    ax1.legend()
    link = doc["iperf3_bidir_gbit_s"]["both"]
    vals = [doc["busbw_64m_gbit_s"]["sparkring"], doc["busbw_64m_gbit_s"]["gloo"], link]
    ax2.bar(["sparkring", "gloo", "iperf3 both ways"], vals, color=["C0", "C1", "grey"])
    ax2.axhline(0.85 * link, color="red", linestyle="--", label="target 0.85 x iperf3 both ways")
    ax2.set_ylim(0, 1.2 * max(vals))
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
    ring = netns.NetnsRing("tp-burn", NETNS_WORLD, NETNS_PREFIX)
    ring.destroy()
    ring.create()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "transport", "probe", "--world", str(NETNS_WORLD), "--ring-prefix", NETNS_PREFIX,
           "--skip-links", "--burn", "all_reduce", "--burn-dtype", args.dtype, "--burn-size", str(args.size),
           "--burn-iters", str(args.iters), "--timeout", "30"]  # fmt: skip
    start, t0 = RunProvenance.capture(), time.monotonic()
    try:
        procs = [subprocess.Popen(ring.exec_argv(r, [*cmd, "--rank", str(r)]), stdout=subprocess.PIPE, text=True,
                                  env=env) for r in range(NETNS_WORLD)]  # fmt: skip
        docs = [json.loads(p.communicate()[0]) for p in procs]
    finally:
        ring.destroy()
    summary = {"schema": "sparkring.bench.transport_burn/2", "ok": all(d["ok"] for d in docs),
               "provenance": start.finish(), "seconds": round(time.monotonic() - t0, 1),
               "errors": [d["error"] for d in docs if d["error"]], "ranks": [d["burns"] for d in docs],
               "mismatches": sum(b["mismatches"] for d in docs for b in d["burns"])}  # fmt: skip
    _write(summary, Path(args.out), ("ok", "mismatches", "seconds"), draw=False)
    if not summary["ok"]:
        raise SystemExit(1)


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, out, helptext in (
        ("host", "transport_host.json", "unshaped loopback at 2 and 4 ranks vs gloo"),
        ("run", "transport.json", "the namespace ring: latency unshaped, 64 MB shaped, vs gloo"),
    ):
        c = sub.add_parser(name, help=f"{helptext} -> benchmarks/results/{out} (+ .png)")
        c.add_argument(
            "--out", default=str(RESULTS / out), help="results file; the plot lands beside it (.png)"
        )
        c.add_argument("--rounds", type=int, default=8, help="turns per implementation and size")
        c.add_argument("--block-bytes", type=int, default=4 << 20,
                       help="bytes all-reduced per turn (calls per turn: this / size, 1..50)")  # fmt: skip
    sub.choices["host"].add_argument("--worlds", type=int, nargs="+", default=list(HOST_WORLDS))
    sub.choices["host"].add_argument(
        "--sizes", type=_sizes, default=HOST_SIZES, help="bytes, comma-separated"
    )
    sub.choices["host"].add_argument(
        "--port", type=int, default=29100, help="first tcp port (2 per world size)"
    )
    r = sub.choices["run"]
    r.add_argument("--rate", default="500mbit", help="tc tbf rate of every ring link")
    r.add_argument("--iperf-seconds", type=int, default=5)
    b = sub.add_parser("burn", help="the all-reduce burn -> benchmarks/results/transport_burn.json")
    b.add_argument("--iters", type=int, default=1_000_000)
    b.add_argument("--size", type=int, default=16384)
    b.add_argument("--dtype", default="float32")
    b.add_argument("--out", default=str(RESULTS / "transport_burn.json"))
    rp = sub.add_parser("replot", help="draw the plot of a results file again")
    rp.add_argument("results", type=Path)
    w = sub.add_parser("worker", help=argparse.SUPPRESS)
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--world", type=int, required=True)
    w.add_argument("--prefix", required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--gloo-addr", required=True)
    w.add_argument("--gloo-ifname", default="", help="empty: the rank's left ring interface")
    w.add_argument("--rounds", type=int, required=True)
    w.add_argument("--block-bytes", type=int, required=True)
    w.add_argument("--sizes", type=_sizes, required=True)
    args = p.parse_args()
    if args.command == "replot":
        plot(args.results)
        return
    {"host": host, "run": run, "burn": burn, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
