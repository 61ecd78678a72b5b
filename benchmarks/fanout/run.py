"""Fan-out benchmark on the simulated ring: pipelined two-direction fan-out vs one link copy.

    sudo .venv/bin/python -m benchmarks.fanout.run --out benchmarks/results/fanout-<lane>.json \
        [--size-mib 96] [--rate-mbit 400] [--repeats 3] [--private-ring]
    .venv/bin/python -m benchmarks.fanout.run --out benchmarks/results/fanout-<lane>.json --replot

Every ring link (both ends of all four cables) is shaped by tc tbf to the same rate. In the same
run, with the same agent code and verification, it times:
  single_link       rank 0 -> rank 1 over one cable (the floor: one link transfer),
  store_and_forward r0 -> r1, then r1 -> r2, then r2 -> r3, whole file per hop (an rsync chain),
  fanout            the real plan: r0 -> r1 and r0 -> r3 at once, relays forwarding chunks as they
                    arrive, r2 fed half by r1 and half by r3.
The three cases alternate within each repeat, so a change of load reaches all of them; the load
average of each repeat is recorded. Writes the JSON named by --out (top-level ratio_vs_single_link =
fanout / single_link, medians; the run's provenance) and its plot beside it (.png); --replot only
redraws the plot of an existing --out. Target: ratio_vs_single_link <= 1.15. The shaping is removed
afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
from benchmarks.provenance import RunProvenance, load_average

ROOT = Path(__file__).resolve().parents[2]

WORK = Path("/tmp/im-bench-fanout")


def load_fanout():
    """The fan-out module_utils imported as the agent script imports it (its siblings resolve from
    module_utils/, as Ansible's would from ansible.module_utils)."""
    return load_module_utils("sparkring_fanout")


def fresh_dirs(case: str, hosts: list[str], source: Path) -> dict[str, Path]:
    """One directory per rank; the source rank's holds the archive (a hard link, no copy)."""
    dirs = {}
    for host in hosts:
        directory = WORK / case / host
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        dirs[host] = directory
    os.link(source, dirs[hosts[0]] / source.name)
    return dirs


def config(manifest: dict, directory: Path, rank: int, world: int, links: list[dict]) -> dict:
    return {
        "files": [manifest],
        "dest": str(directory),
        "rank": rank,
        "world_size": world,
        "links": links,
        "connect_timeout": 30,
        "io_timeout": 60,
    }


def checked(results: dict[str, dict]) -> None:
    failed = {host: r["msg"] for host, r in results.items() if r.get("failed")}
    if failed:
        raise SystemExit(f"transfer failed: {failed}")


def pair_copy(hostvars, manifest, source: Path, sender: str, receiver: str, case: str) -> tuple[float, Path]:
    dirs = fresh_dirs(case, [sender, receiver], source)
    links = pair_links(hostvars, sender, receiver)
    results, seconds = run_agents(
        hostvars,
        {
            sender: config(manifest, dirs[sender], 0, 2, links[sender]),
            receiver: config(manifest, dirs[receiver], 1, 2, links[receiver]),
        },
    )
    checked(results)
    return seconds, dirs[receiver] / source.name


def fanout(hostvars, manifest, source: Path) -> tuple[float, dict]:
    hosts = sorted(hostvars, key=lambda h: hostvars[h]["sparkring_rank"])
    dirs = fresh_dirs("fanout", hosts, source)
    world = len(hosts)
    results, seconds = run_agents(
        hostvars,
        {
            host: config(
                manifest, dirs[host], hostvars[host]["sparkring_rank"], world, ring_links(hostvars, host)
            )
            for host in hosts
        },
    )
    checked(results)
    return seconds, results


def measure(fan, hostvars: dict, args) -> tuple[dict[str, list[float]], dict, dict, list[dict]]:
    """The three cases, interleaved per repeat, with every ring link shaped to the same rate."""
    hosts = sorted(hostvars, key=lambda h: hostvars[h]["sparkring_rank"])
    WORK.mkdir(parents=True, exist_ok=True)
    source = WORK / "archive.bin"
    with source.open("wb") as out:  # incompressible, like a zstd archive
        for _ in range(args.size_mib):
            out.write(os.urandom(1 << 20))
    manifest = fan.build_manifest(str(source), int(args.chunk_mib * (1 << 20))).to_dict()
    runs: dict[str, list[float]] = {"single_link": [], "store_and_forward": [], "fanout": []}
    sent: dict = {}
    loads: list[dict] = []
    shape(hostvars, args.rate_mbit)
    try:
        for _ in range(args.repeats):
            loads.append(load_average())
            seconds, _ = pair_copy(hostvars, manifest, source, hosts[0], hosts[1], "single")
            runs["single_link"].append(seconds)
            total, held = 0.0, source
            for hop, (a, b) in enumerate(itertools.pairwise(hosts)):
                seconds, held = pair_copy(hostvars, manifest, held, a, b, f"chain{hop}")
                total += seconds
            runs["store_and_forward"].append(total)
            seconds, results = fanout(hostvars, manifest, source)
            runs["fanout"].append(seconds)
            sent = {host: r["sent_bytes"] for host, r in results.items()}
    finally:
        unshape(hostvars)
        shutil.rmtree(WORK, ignore_errors=True)
    return runs, sent, manifest, loads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=96)
    parser.add_argument("--rate-mbit", type=int, default=400)
    parser.add_argument("--chunk-mib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--private-ring", action="store_true", help="bare im-fanout-* namespaces, not the sim ring"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="the results JSON to write (the plot goes beside it, .png)"
    )
    parser.add_argument("--replot", action="store_true", help="only redraw the plot of an existing --out")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root: network namespaces and tc")
    started = RunProvenance.capture()
    fan = load_fanout()
    ring = private_ring() if args.private_ring else contextlib.nullcontext(None)
    with ring as private:
        hostvars = private or inventory_hostvars()
        runs, sent, manifest, loads = measure(fan, hostvars, args)
    median = {name: statistics.median(values) for name, values in runs.items()}
    size = manifest["size"]
    report = {
        "ratio_vs_single_link": round(median["fanout"] / median["single_link"], 3),
        "ratio_store_and_forward_vs_single_link": round(
            median["store_and_forward"] / median["single_link"], 3
        ),
        "target_ratio_vs_single_link": 1.15,
        "median_s": {name: round(value, 3) for name, value in median.items()},
        "runs_s": {name: [round(v, 3) for v in values] for name, values in runs.items()},
        "load_avg_by_repeat": loads,
        "repeats_interleaved": True,
        "archive_bytes": size,
        "chunk_bytes": manifest["chunk_size"],
        "link_rate_mbit": args.rate_mbit,
        "single_link_goodput_mbit": round(size * 8 / median["single_link"] / 1e6, 1),
        "fanout_sent_bytes_by_rank": sent,
        "ranks": len(sent),
        "shaping": "tc tbf on every ring interface, both ends, burst 10 ms, latency 50 ms",
        "lane": (
            "private veth ring (bare namespaces, sim geometry)"
            if args.private_ring
            else "sim ring (sr-* namespaces from inventories/sim)"
        ),
        "provenance": started.finish(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    try:
        plot(report, args.out.with_suffix(".png"))
    except ImportError:  # a machine without matplotlib: draw it later with --replot
        print(f"matplotlib missing: run with --out {args.out} --replot for the plot", file=sys.stderr)
    return 0


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["single_link", "fanout", "store_and_forward"]
    labels = [
        "one link copy\n(r0 -> r1)",
        "SparkRing fan-out\n(all 3 peers)",
        "store-and-forward\nchain (3 hops)",
    ]
    values = [report["median_s"][n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(labels, values, color=["#888888", "#2a7ab0", "#c0504d"])
    for bar, value in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.2f} s", ha="center", va="bottom")
    ax.set_ylabel("seconds (median)")
    for x, name in enumerate(names):  # every repeat, so the spread shows
        ax.plot([x] * len(report["runs_s"][name]), report["runs_s"][name], "k.", markersize=5)
    cores = report.get("provenance", {}).get("cpu_cores") or report.get("cpu_cores")
    ax.set_title(
        f"{report['archive_bytes'] / 2**20:.0f} MiB archive, every ring link tbf {report['link_rate_mbit']} Mbit/s, "
        f"{cores} cores; fan-out / one link = {report['ratio_vs_single_link']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
