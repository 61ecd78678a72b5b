"""Model fan-out benchmark on the simulated ring: a multi-shard checkpoint to three peers vs one link copy.

    sudo .venv/bin/python -m benchmarks.model_fanout.run [--total-mib 2048] [--shards 4] [--rate-mbit 400]
        [--chunk-mib 16] [--repeats 3] [--work DIR] [--private-ring]

A checkpoint of several safetensors shards (checkpoint.py: the files the model stage moves) is
sent with the model stage's own agent (module_utils/sparkring_fanout.py, a FileSet with every
chunk verified on arrival and every file verified whole) while every ring link (both ends of all
four cables) is shaped by tc tbf to the same rate. In the same run, interleaved per repeat:
  single_link  rank 0 -> rank 1 over one cable (the floor: one copy over one link),
  fanout       the real plan: r0 -> r1 and r0 -> r3 at once, relays forwarding chunks as they
               arrive, r2 fed half by r1 and half by r3.
Writes benchmarks/results/model_fanout.json (ratio_vs_single_link = median fanout / median
single_link; target <= 1.15) and model_fanout.png. Every run is kept: each is appended whole to
model_fanout-history.jsonl beside it, and the results file lists every kept run's headline with
its commit, time and load. The shaping is removed afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from sparkring.module_utils import load_module_utils

from benchmarks.fanout.netns_ring import (
    inventory_hostvars,
    pair_links,
    private_ring,
    ring_links,
    run_agents,
    shape,
    unshape,
)
from benchmarks.history import append_run, history_path, load_runs, source_trees
from benchmarks.model_fanout.checkpoint import generate
from benchmarks.provenance import RunProvenance

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 1.15


def load_fanout():
    """The fan-out module_utils imported as the agent script imports it (its siblings resolve from
    module_utils/, as Ansible's would from ansible.module_utils)."""
    return load_module_utils("sparkring_fanout")


def fresh_dirs(work: Path, case: str, hosts: list[str], source: Path, names: list[str]) -> dict[str, Path]:
    """One directory per rank; the source rank's holds the checkpoint (hard links, no copy)."""
    dirs = {}
    for host in hosts:
        directory = work / case / host
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        dirs[host] = directory
    for name in names:
        (dirs[hosts[0]] / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(source / name, dirs[hosts[0]] / name)
    return dirs


def config(files: list[dict], directory: Path, rank: int, world: int, links: list[dict]) -> dict:
    return {
        "files": files,
        "dest": str(directory),
        "rank": rank,
        "world_size": world,
        "links": links,
        "connect_timeout": 60,
        "io_timeout": 120,
    }


def checked(results: dict[str, dict]) -> None:
    failed = {host: r["msg"] for host, r in results.items() if r.get("failed")}
    if failed:
        raise SystemExit(f"transfer failed: {failed}")


def single_link(work: Path, hostvars, files, source: Path, names: list[str]) -> float:
    hosts = sorted(hostvars, key=lambda h: hostvars[h]["sparkring_rank"])[:2]
    dirs = fresh_dirs(work, "single", hosts, source, names)
    links = pair_links(hostvars, *hosts)
    configs = {host: config(files, dirs[host], rank, 2, links[host]) for rank, host in enumerate(hosts)}
    results, seconds = run_agents(hostvars, configs)
    checked(results)
    shutil.rmtree(work / "single")  # the receivers' copies go at once: the peak is one case's
    return seconds


def fanout(work: Path, hostvars, files, source: Path, names: list[str]) -> tuple[float, dict]:
    hosts = sorted(hostvars, key=lambda h: hostvars[h]["sparkring_rank"])
    dirs = fresh_dirs(work, "fanout", hosts, source, names)
    configs = {
        host: config(
            files, dirs[host], hostvars[host]["sparkring_rank"], len(hosts), ring_links(hostvars, host)
        )
        for host in hosts
    }
    results, seconds = run_agents(hostvars, configs)
    checked(results)
    shutil.rmtree(work / "fanout")
    return seconds, {host: r["sent_bytes"] for host, r in results.items()}


def measure(fan, hostvars: dict, args) -> dict:
    """Both cases, interleaved per repeat, every ring link shaped to the same rate."""
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    source = work / "checkpoint"
    pinned = generate(source, args.total_mib, args.shards)
    names = [f["path"] for f in pinned]
    chunk = int(args.chunk_mib * (1 << 20))
    files = [fan.build_manifest(str(source / name), chunk, name=name).to_dict() for name in names]
    runs: dict[str, list[float]] = {"single_link": [], "fanout": []}
    sent: dict = {}
    shape(hostvars, args.rate_mbit)
    try:
        for _ in range(args.repeats):
            runs["single_link"].append(single_link(work, hostvars, files, source, names))
            seconds, sent = fanout(work, hostvars, files, source, names)
            runs["fanout"].append(seconds)
    finally:
        unshape(hostvars)
        shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "sent": sent, "pinned": pinned, "chunk": chunk}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rate-mbit", type=int, default=400)
    parser.add_argument("--chunk-mib", type=float, default=16.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--private-ring", action="store_true", help="bare im-model-* namespaces, not the sim ring"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/im-bench-model-fanout"),
        help="where the checkpoint and every rank's copy live (peak: 4 copies of it; /dev/shm keeps disks out)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "model_fanout.json")
    parser.add_argument("--replot", type=Path, help="only draw the plot of an existing results file")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root: network namespaces and tc")
    start = RunProvenance.capture()
    fan = load_fanout()
    ring = private_ring(prefix="im-model-") if args.private_ring else contextlib.nullcontext(None)
    with ring as private:
        hostvars = private or inventory_hostvars()
        measured = measure(fan, hostvars, args)
    runs = measured["runs"]
    median = {name: statistics.median(values) for name, values in runs.items()}
    size = sum(f["size"] for f in measured["pinned"])
    report = {
        "ratio_vs_single_link": round(median["fanout"] / median["single_link"], 3),
        "target_ratio_vs_single_link": TARGET,
        "median_s": {name: round(value, 3) for name, value in median.items()},
        "runs_s": {name: [round(v, 3) for v in values] for name, values in runs.items()},
        "checkpoint": {
            "bytes": size,
            "files": len(measured["pinned"]),
            "safetensors_shards": args.shards,
            "generator": "benchmarks/model_fanout/checkpoint.py",
        },
        "chunk_bytes": measured["chunk"],
        "link_rate_mbit": args.rate_mbit,
        "single_link_goodput_mbit": round(size * 8 / median["single_link"] / 1e6, 1),
        "fanout_sent_bytes_by_rank": measured["sent"],
        "shaping": "tc tbf on every ring interface, both ends, burst 10 ms, latency 50 ms",
        "storage": str(args.work),
        "lane": (
            "private veth ring (bare namespaces, sim geometry)"
            if args.private_ring
            else "sim ring (sr-* namespaces from inventories/sim)"
        ),
        "source_trees": source_trees(["module_utils/sparkring_fanout.py", "benchmarks/model_fanout"]),
        "provenance": start.finish(),
    }
    history = history_path(args.out)
    append_run(history, report)
    report["history"] = {
        "file": history.name,
        "runs": [
            {
                "started_utc": run["provenance"]["started_utc"],
                "git_commit": run["provenance"]["git_commit"],
                "cpu_cores": run["provenance"]["cpu_cores"],
                "load_avg_1m": [
                    run["provenance"]["load_avg_start"]["1m"],
                    run["provenance"]["load_avg_end"]["1m"],
                ],
                "ratio_vs_single_link": run["ratio_vs_single_link"],
                "checkpoint_bytes": run["checkpoint"]["bytes"],
                "link_rate_mbit": run["link_rate_mbit"],
            }
            for run in load_runs(history)
        ],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    try:
        plot(report, args.out.with_suffix(".png"))
    except ImportError:  # a machine without matplotlib: draw it later with --replot
        print(f"matplotlib missing: run with --replot {args.out} for the plot", file=sys.stderr)
    return 0


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["single_link", "fanout"]
    labels = ["one copy over one link\n(r0 -> r1)", "SparkRing model fan-out\n(all 3 peers, both directions)"]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(labels, [report["median_s"][n] for n in names], color=["#888888", "#2a7ab0"], alpha=0.8)
    for bar, name in zip(bars, names, strict=True):
        runs = report["runs_s"][name]
        ax.plot([bar.get_x() + bar.get_width() / 2] * len(runs), runs, "k.", label=None)
        ax.text(
            bar.get_x() + bar.get_width() / 2,
            report["median_s"][name],
            f"{report['median_s'][name]:.1f} s",
            ha="center",
            va="bottom",
        )
    ax.set_ylabel("seconds (bar: median; dots: every run)")
    checkpoint = report["checkpoint"]
    ax.set_title(
        f"{checkpoint['bytes'] / 2**30:.2f} GiB checkpoint ({checkpoint['files']} files, "
        f"{checkpoint['safetensors_shards']} shards), every ring link tbf {report['link_rate_mbit']} Mbit/s; "
        f"fan-out / one link = {report['ratio_vs_single_link']} (target <= {report['target_ratio_vs_single_link']})",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
