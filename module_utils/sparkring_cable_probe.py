# Copyright: SparkRing contributors. Apache-2.0.
"""The transport probe on one cable: a two-rank ring of its two ends, run once per frame size.

Cable qualification runs `python -m transport probe` (the build stage installs the transport package
on every rank) with this end's half of the ring on its stdin, and reads the probe's JSON report.
Standard library only: it ships to the nodes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

# (argv, data=stdin) -> (rc, stdout, stderr): the module's run_command.
Runner = Callable[..., tuple[int, str, str]]


def probe_spec(rank: int, port: dict[str, Any], fabric: str) -> dict[str, Any]:
    """This end's half of a two-rank ring on this cable only (the lower rank is pair rank 0)."""
    me = 0 if rank < port["peer_rank"] else 1
    return {
        "rank": me,
        "world": 2,
        "ports": [
            {
                "cage": port["cage"],
                "address": port["address"],
                "peer_rank": 1 - me,
                "peer_address": port["peer_address"],
                "twins": port["twins"] if fabric == "verbs" else [],
            }
        ],
    }


def probe_argv(probe: dict[str, Any], fabric: str, size: int) -> list[str]:
    """The probe command for one frame size (the module's `probe` option); the ring spec goes to its stdin."""
    return [
        probe["python"],
        "-m",
        "transport",
        "probe",
        "--fabric",
        fabric,
        "--ring-spec",
        "-",
        "--tcp-port",
        str(probe["tcp_port"]),
        "--setup-timeout",
        f"{probe['setup_timeout_s']:g}",
        "--timeout",
        f"{probe['timeout_s']:g}",
        "--pingpong-size",
        str(size),
        "--pingpong-iters",
        str(probe["iterations"]),
        "--bw-size",
        str(size),
        "--bw-iters",
        str(probe["iterations"]),
        "--burn",
        "none",
    ]


def run_probe(
    run: Runner, probe: dict[str, Any], fabric: str, rank: int, port: dict[str, Any], size: int
) -> tuple[dict[str, Any] | None, str | None]:
    """One probe run: its JSON report, or None and why there is none (or why it failed)."""
    if not os.path.isdir(os.path.join(probe["pythonpath"], "transport")):
        return (
            None,
            f"no transport package under {probe['pythonpath']}: run the build stage (playbooks/build.yml)",
        )
    rc, out, err = run(probe_argv(probe, fabric, size), data=json.dumps(probe_spec(rank, port, fabric)))
    try:
        doc = json.loads(out)
    except ValueError:
        return None, f"probe exit {rc}, no JSON: {(err or out).strip()[-300:]}"
    return doc, None if rc == 0 or doc.get("error") else f"probe exit {rc}: {err.strip()[-300:]}"
