"""Run a function as every rank of a loopback ring, one process each (spawned, not forked).

The ring uses the inventory's cable geometry on 127.77.i.0/24 loopback addresses, so
every rank binds and dials exactly the addresses it would on real cables.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from transport.topology import cable_geometry

PREFIX = "127.77"


def _entry(fn: Callable[..., Any], rank: int, world: int, tcp_port: int, queue: Any, kwargs: dict) -> None:
    try:
        queue.put((rank, "ok", fn(cable_geometry(rank, world, PREFIX), tcp_port, **kwargs)))
    except BaseException as exc:  # the parent asserts on what each rank raised
        queue.put((rank, "error", (type(exc).__name__, str(exc), traceback.format_exc())))


def run_ring(
    fn: Callable[..., Any], world: int, tcp_port: int, timeout_s: float = 600, **kwargs: Any
) -> list:
    """[(status, value)] per rank; a rank that does not report within timeout_s fails the test.

    The collectives bound every wait themselves (a stuck rank reports its error within its
    own timeout); this outer bound only catches a rank that died without reporting, and is
    generous because a loaded two-core machine runs the spawned ranks slowly.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, tcp_port, queue, kwargs)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(
            (rank, (status, value)) for rank, status, value in (queue.get(timeout=timeout_s) for _ in procs)
        )
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


def fault_mid_burn(
    burn: Callable[..., None], world: int, tcp_port: int, sig: int, bound_s: float, victim: int = 2
) -> dict[int, tuple]:
    """Run ``burn(rank, tcp_port, progress, queue)`` on every rank, send ``sig`` to ``victim`` once
    every rank has completed 50 collectives, and return each survivor's report by rank.

    ``burn`` counts its collectives in ``progress[rank]`` and, when one fails, puts
    ``(rank, *report)`` on ``queue`` and returns.
    """
    ctx = mp.get_context("spawn")
    progress, queue = ctx.Array("l", world), ctx.Queue()
    procs = [ctx.Process(target=burn, args=(r, tcp_port, progress, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        while min(progress[:]) < 50:  # mid-burn: every rank has completed collectives
            if not all(p.is_alive() for p in procs):
                pytest.fail("a rank died before the fault was injected")
            procs[victim].join(0.05)
        os.kill(procs[victim].pid, sig)
        # Each survivor must report within the bound plus slack for process scheduling.
        reports = [queue.get(timeout=bound_s * 3 + 10) for _ in range(world - 1)]
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    return {r[0]: r[1:] for r in reports}
