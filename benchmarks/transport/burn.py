"""``bench.py burn`` (root): the probe's all-reduce burn in every namespace of a private ring.

Every result is compared byte for byte with the reference; the summary lands in
benchmarks/results/transport_burn.json, and every burn is kept in its history, a failed one too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.provenance import ROOT, RunProvenance
from benchmarks.transport.results import write
from benchmarks.transport.run import NETNS_PREFIX, NETNS_WORLD
from transport import netns


def burn(args: argparse.Namespace) -> None:
    """The 16 KB all-reduce burn: every result compared byte for byte with the reference."""
    why = netns.available()
    if why:
        raise SystemExit(f"cannot burn here: {why}")
    ring = netns.NetnsRing("tp-burn", NETNS_WORLD, NETNS_PREFIX)
    ring.destroy()
    ring.create()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "transport",
        "probe",
        "--world",
        str(NETNS_WORLD),
        "--ring-prefix",
        NETNS_PREFIX,
        "--skip-links",
        "--burn",
        "all_reduce",
        "--burn-dtype",
        args.dtype,
        "--burn-size",
        str(args.size),
        "--burn-iters",
        str(args.iters),
        "--timeout",
        "30",
    ]
    start, t0 = RunProvenance.capture(), time.monotonic()
    try:
        procs = [
            subprocess.Popen(
                ring.exec_argv(r, [*cmd, "--rank", str(r)]), stdout=subprocess.PIPE, text=True, env=env
            )
            for r in range(NETNS_WORLD)
        ]
        docs = [json.loads(p.communicate()[0]) for p in procs]
    finally:
        ring.destroy()
    summary = {
        "schema": "sparkring.bench.transport_burn/2",
        "ok": all(d["ok"] for d in docs),
        "provenance": start.finish(),
        "seconds": round(time.monotonic() - t0, 1),
        "errors": [d["error"] for d in docs if d["error"]],
        "ranks": [d["burns"] for d in docs],
        "mismatches": sum(b["mismatches"] for d in docs for b in d["burns"]),
    }
    write(summary, Path(args.out), ("ok", "mismatches", "seconds"))
    if not summary["ok"]:
        raise SystemExit(1)
