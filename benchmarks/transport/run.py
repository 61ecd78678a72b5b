"""``bench.py run`` (root): the sim's geometry in a private four-namespace ring, against gloo.

The ring (tp-bench-r*, veth cables, MTU 9000, 10.78.i.0/24) is deleted afterwards. The ranks
forward for each other (routes to the diagonal cables through a neighbour) because gloo needs
every pair; SparkRing only ever talks to its neighbours. It measures all-reduce latency at 1 KB,
16 KB and 1 MB unshaped; then, with every ring interface shaped by tc tbf (--rate, 500 Mbit/s by
default, so the link and not the two shared CPUs is the limit: SparkRing's ring loads both
directions of all four cables, 8 x rate through one kernel), iperf3 on one cable in both
directions at once (--bidir) as the reference, and 64 MB bus bandwidth. SparkRing's two
half-rings run in opposite directions, so its bus bandwidth can reach that two-way sum. gloo rank
r binds the address on its left cable, so its ring traffic between neighbours takes the direct link.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from benchmarks.provenance import RunProvenance
from benchmarks.transport.ranks import BIG, IMPLS, spawn_ranks, summarize, worker_cfg
from benchmarks.transport.results import write
from transport import netns, schedule
from transport.topology import cable_geometry

NETNS_PREFIX = "10.78"
NETNS_WORLD = 4
NETNS_SIZES = (1024, 16384, 1 << 20)


def iperf3_bidir(ring: netns.NetnsRing, seconds: int) -> dict[str, float]:
    """iperf3 on cable 0 in both directions at once: each direction's and the summed Gbit/s."""
    a, b = (cable_geometry(r, NETNS_WORLD, NETNS_PREFIX).port_to(1 - r).address for r in (0, 1))
    server = subprocess.Popen(
        ring.exec_argv(1, ["iperf3", "-s", "-1", "-B", b, "-p", "5201"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        client = ["iperf3", "-c", b, "-B", a, "-p", "5201", "-t", str(seconds), "--bidir", "-J"]
        out = subprocess.run(ring.exec_argv(0, client), capture_output=True, text=True, check=True)
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
            NETNS_WORLD, ring.exec_argv, worker_cfg(args, NETNS_SIZES, NETNS_PREFIX, 28800, head)
        )
        ring.shape(args.rate)
        link = iperf3_bidir(ring, args.iperf_seconds)
        bw = spawn_ranks(NETNS_WORLD, ring.exec_argv, worker_cfg(args, (BIG,), NETNS_PREFIX, 28810, head))
    finally:
        ring.destroy()
    latency, busbw = summarize(lat, NETNS_WORLD, NETNS_SIZES), summarize(bw, NETNS_WORLD, (BIG,))[str(BIG)]
    gbit = {impl: round(busbw[impl]["busbw_gbyte_s"] * 8, 4) for impl in IMPLS}
    doc = {
        "schema": "sparkring.bench.transport/2",
        "provenance": start.finish(),
        "ring": {
            "world": NETNS_WORLD,
            "links": "veth in private network namespaces, MTU 9000",
            "prefix": NETNS_PREFIX,
            "shaped_rate": args.rate,
            "fabric": "tcp",
            "forwarding": "on (gloo needs every pair)",
            "rounds": args.rounds,
            "block_bytes": args.block_bytes,
        },
        "sparkring_algorithms": {
            str(s): schedule.allreduce_algorithm(NETNS_WORLD, s) for s in (*NETNS_SIZES, BIG)
        },
        "allreduce_latency_fp32": latency,
        "iperf3_bidir_gbit_s": link,
        "busbw_64m_gbit_s": gbit,
        "busbw_64m_iterations": busbw["sparkring"]["iterations"],
        "notes": "per size, SparkRing and gloo take turns in the same processes; latency unshaped; bandwidth with "
        "every ring interface shaped by tc tbf; p50/p99 are the slowest rank's; the reference is iperf3 "
        "on one cable in both directions at once, which SparkRing's two half-rings can fill; the rate is "
        "low enough that the link, not the two shared cores, limits: the half-rings push 8 x rate through "
        "one kernel",
    }
    doc["allreduce_16k_p50_ratio_vs_gloo"] = latency["16384"]["p50_ratio_vs_gloo"]
    doc["busbw_64m_ratio_vs_bidir_link"] = round(gbit["sparkring"] / link["both"], 4)
    doc["gloo_busbw_64m_ratio_vs_bidir_link"] = round(gbit["gloo"] / link["both"], 4)
    doc["targets"] = {"allreduce_16k_p50_ratio_vs_gloo": "<= 0.5", "busbw_64m_ratio_vs_bidir_link": ">= 0.85"}
    doc["targets_met"] = {
        "allreduce_16k_p50_ratio_vs_gloo": doc["allreduce_16k_p50_ratio_vs_gloo"] <= 0.5,
        "busbw_64m_ratio_vs_bidir_link": doc["busbw_64m_ratio_vs_bidir_link"] >= 0.85,
    }
    headline = ("allreduce_16k_p50_ratio_vs_gloo", "busbw_64m_ratio_vs_bidir_link")
    write(doc, Path(args.out), headline, plot_run)


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
