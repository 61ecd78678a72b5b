"""Ring transport benchmark: SparkRing's tcp fabric against torch.distributed gloo, same links, same run.

    .venv/bin/python -m benchmarks.transport.bench host      # -> benchmarks/results/transport_host.json + .png
    sudo .venv/bin/python -m benchmarks.transport.bench run  # -> benchmarks/results/transport.json + .png
    sudo .venv/bin/python -m benchmarks.transport.bench burn --iters 1000000   # 16 KB all-reduce burn
    .venv/bin/python -m benchmarks.transport.bench replot benchmarks/results/transport_host.json

``host`` (no root): unshaped loopback at 2 and 4 ranks (host.py). ``run`` (root): the sim's
geometry in a private four-namespace ring, latency unshaped and 64 MB bandwidth shaped, with iperf3
as the reference (run.py). ``burn`` (root): the probe's all-reduce burn in every namespace (burn.py).
Every rank process holds a SparkRing communicator and a gloo process group at once and the two take
turns per size (ranks.py); every run is kept in a history beside its results file (results.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.transport.burn import burn
from benchmarks.transport.host import HOST_SIZES, HOST_WORLDS, host, plot_host
from benchmarks.transport.ranks import worker
from benchmarks.transport.results import RESULTS, draw
from benchmarks.transport.run import plot_run, run


def replot(results: Path) -> None:
    """Draw the plot of a results file again (host or run, by its schema)."""
    host_run = json.loads(results.read_text())["schema"].startswith("sparkring.bench.transport_host/")
    draw(results, plot_host if host_run else plot_run)


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
        c.add_argument(
            "--block-bytes",
            type=int,
            default=4 << 20,
            help="bytes all-reduced per turn (calls per turn: this / size, 1..50)",
        )
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
        replot(args.results)
        return
    {"host": host, "run": run, "burn": burn, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
