"""Run a function as every rank of a real two-or-four-process group on loopback.

Each rank is a spawned process with a gloo process group (the stock path vLLM's CPU
communicator uses; the device lane asks for nccl: one GPU per rank, or ranks sharing
a GPU through transport.gpu.nccl_rank_env) and the overlay pointed at the inventory's cable geometry on
127.77.i.0/24, so the ring transport binds and dials exactly what it would on cables.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    fn: Callable[..., Any], rank: int, world: int, env: dict[str, str], queue: Any, backend: str
) -> None:
    try:
        os.environ.update(env)
        import torch
        import torch.distributed as dist

        if backend == "nccl" or env.get("SPARKRING_TEST_CUDA"):
            torch.cuda.set_device(rank % torch.cuda.device_count())
        if backend == "nccl":  # ranks sharing a GPU each get their own NCCL_HOSTID (socket transport)
            from transport.gpu import nccl_rank_env

            os.environ.update(nccl_rank_env(rank, world, torch.cuda.device_count()))
        dist.init_process_group(backend, rank=rank, world_size=world)
        try:
            queue.put((rank, "ok", fn(rank, world)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # the parent asserts on what each rank raised
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_group(
    fn: Callable[[int, int], Any], world: int, timeout_s: float = 120, backend: str = "gloo", **env: str
) -> list[Any]:
    """fn(rank, world) on every rank; returns the values in rank order, or fails with a rank's error."""
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "SPARKRING_RING_PREFIX": "127.77",
        "SPARKRING_TRANSPORT_PORT": str(free_port()),
        **env,
    }
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, env, queue, backend)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = {
            rank: (status, value) for rank, status, value in (queue.get(timeout=timeout_s) for _ in procs)
        }
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [f"rank {r}: {v}" for r, (s, v) in sorted(results.items()) if s != "ok"]
    assert not errors, "\n".join(errors)
    return [results[r][1] for r in range(world)]
