# Copyright: SparkRing contributors. Apache-2.0.
"""A cable's bulk bandwidth against its absolute floors (CQ-BW-FUNCTION, CQ-BW-CABLE), from one end.

On verbs, perftest's ib_write_bw on each twin alone and on every twin at once (sparkring_rdma_bw:
the lower rank serves, the higher connects and judges); on tcp, the transport probe's slowest
direction is the cable's figure (the sim). The judgements are sparkring_cable_checks'.
Standard library only: it ships to the nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.module_utils.sparkring_cable_checks import (
    NO_FLOORS,
    TCP_HAS_NO_FUNCTIONS,
    bulk_skip,
    judge_bulk,
    judge_bulk_run,
    perftest_missing,
)
from ansible.module_utils.sparkring_rdma_bw import BandwidthError, ib_write_bw_argv, run_stages, stage_port
from ansible.module_utils.sparkring_ring_checks import Check, edge_subject

# (argv, data=None) -> (rc, stdout, stderr), and (name, required) -> path or None: the module's own.
Runner = Callable[..., tuple[int, str, str]]
Which = Callable[..., str | None]


def measure_floors(
    params: dict[str, Any],
    run: Runner,
    which: Which,
    gid_indices: dict[str, int],
    frames: list[dict[str, Any]],
    not_run: str | None,
) -> tuple[dict[str, Any] | None, list[Check]]:
    """This end's CQ-BW-* checks and its `bulk` measurement (None where nothing was measured).

    `params` are sparkring_cable's; `frames` the probe's figures (the tcp cable's); `not_run` says why
    no traffic may run now (check mode, an earlier failure), else None."""
    min_function, min_cable = params["min_function_gbit_s"], params["min_cable_gbit_s"]
    rank, port = params["rank"], params["port"]
    subject = edge_subject(rank, port)
    if min_function is None and min_cable is None:
        return None, [bulk_skip(subject, NO_FLOORS)]
    if not_run:
        return None, [bulk_skip(subject, not_run)]
    if params["fabric"] == "tcp":
        cable = min(min(f["tx_gbit_s"], f["rx_gbit_s"]) for f in frames) if frames else None
        method = "the probe over tcp, the slowest direction at any frame size"
        checks = [] if min_function is None else [bulk_skip(subject, TCP_HAS_NO_FUNCTIONS, "CQ-BW-FUNCTION")]
        checks += judge_bulk(rank, port, method, {}, cable, None, min_cable)
        return {"tool": "probe", "functions": {}, "cable_gbit_s": cable}, checks
    return _ib_write_bw(params, run, which, gid_indices)


def _ib_write_bw(
    params: dict[str, Any], run: Runner, which: Which, gid: dict[str, int]
) -> tuple[dict[str, Any], list[Check]]:
    """Each twin alone, then every twin at once; the lower rank serves, the higher connects and judges."""
    rank, port, bulk = params["rank"], params["port"], params["bulk"]
    serving = rank < port["peer_rank"]
    tool = which(bulk["tool"], required=False)
    record: dict[str, Any] = {
        "tool": bulk["tool"],
        "role": "serve" if serving else "connect",
        "size_bytes": bulk["size_bytes"],
        "duration_s": bulk["duration_s"],
        "functions": {},
        "cable_gbit_s": None,
        "error": None,
    }
    if tool is None:
        record["error"] = f"{bulk['tool']} not found"
        return record, [perftest_missing(rank, port, bulk["tool"])]
    twins, timeout_bin = port["twins"], which("timeout", required=False)
    deadline_s = float(bulk["timeout_s"])

    def argv(stage: int, t: int) -> list[str]:
        twin = twins[t]
        return ib_write_bw_argv(
            tool,
            twin["rdma_device"],
            twin["rdma_port"],
            gid[twin["interface"]],
            stage_port(bulk["tcp_port"], stage, t, len(twins)),
            bulk["size_bytes"],
            bulk["duration_s"],
            server=None if serving else port["peer_address"],
            timeout_bin=timeout_bin,
            timeout_s=deadline_s,
        )

    try:
        for group, figures in run_stages(run, argv, len(twins), serving, deadline_s):
            if len(group) == 1 and not serving:
                record["functions"][twins[group[0]]["interface"]] = figures[0]
            if len(group) == len(twins) and not serving:
                record["cable_gbit_s"] = round(sum(figures), 2)
    except BandwidthError as exc:
        record["error"] = str(exc)
    unmeasured = judge_bulk_run(rank, port, record)
    if unmeasured is not None:
        return record, [unmeasured]
    method = f"ib_write_bw {bulk['size_bytes']} B for {bulk['duration_s']} s"
    return record, judge_bulk(
        rank,
        port,
        method,
        record["functions"],
        record["cable_gbit_s"],
        params["min_function_gbit_s"],
        params["min_cable_gbit_s"],
    )
