"""The communicator wrappers: all-reduce and all-gather through the ring transport.

Installed over ``CpuCommunicator``/``CudaCommunicator`` methods by the plugin; ``stock`` is
the upstream method they replace. Per call: a group, dtype or shape the transport does not
take goes to stock (counted as ``fallback``); in ``custom`` mode the ring's result is
returned; in ``shadow`` mode both run, stock's result is returned, and the two are compared
within ``EPS``-scaled bounds (mismatches counted). A transport error dumps the flight recorder and
propagates: a half-working ring must stop the process, not silently diverge between ranks; when
the ring has a dead-peer verdict the process stops at once as overlay.fault does when it idles.

CPU tensors go through the host communicator. CUDA tensors go through the GPU collectives
(transport.gpu): enqueued on the current stream with no host staging, so a call made while a
CUDA graph is captured rides the ring on every replay (path ``graph`` in the recorder, once
per capture; the progress thread counts the replays, see RingGroups.stats). Shadow mode
compares eagerly only: under capture it returns stock alone (path ``shadow_capture``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from overlay.recorder import RECORDER
from overlay.ring import GROUPS

RING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Shadow-mode envelope: the ring adds in its fixed schedule order (transport.schedule), each
# fp16/bf16 add done in fp32 and rounded back at once, so a four-rank matching sum is rounded
# after each round ((a0+a1)+(a2+a3), three roundings), as NCCL rounds each of its partial sums;
# gloo and NCCL add in their own orders, so a sum over `world` ranks may differ by about
# world x eps x its largest magnitude. Outside that it is a real mismatch.
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}

MODE = {"mode": "disabled"}  # set once by the plugin


def dtype_name(x: torch.Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def capturing(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def ring_for(comm: Any, x: torch.Tensor) -> Any | None:
    """The transport collectives for this call (host or GPU, by the tensor's device), or None to use stock."""
    if x.dtype not in RING_DTYPES or x.numel() == 0:
        return None
    if not GROUPS.rides_ring(comm.unique_name, comm.world_size):
        return None
    if RECORDER.rank is None and comm.unique_name.startswith("tp:"):
        RECORDER.rank = comm.rank_in_group
    if x.device.type == "cuda":
        return GROUPS.gpu(comm.unique_name, comm.rank_in_group, comm.world_size)
    return GROUPS.get(comm.unique_name, comm.rank_in_group, comm.world_size)


def run_ring(op: str, x: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The ring's result; on CUDA it is enqueued on the current stream (the time recorded is the enqueue)."""
    path = "graph" if capturing(x) else "ring"
    start = time.perf_counter()
    try:
        out = call(x.detach())
    except Exception as error:
        RECORDER.count(f"{op}.error")
        peer = getattr(error, "peer_rank", None)  # transport errors name the neighbour
        if peer is not None and RECORDER.rank is not None:
            low, high = sorted((RECORDER.rank, peer))
            RECORDER.count(f"cable_error.{low}-{high}")  # /metrics: sparkring:transport_errors
        RECORDER.dump(f"{op} failed")
        GROUPS.watch.stop_if_dead()  # a dead peer: the record and exit 69, as when the ring idles
        raise
    RECORDER.record(op, path, tuple(x.shape), dtype_name(x), time.perf_counter() - start)
    return out


def compare(op: str, ring: torch.Tensor, stock: torch.Tensor, world: int) -> None:
    """Count a shadow mismatch unless |ring - stock| <= world * eps * (|stock| + max |stock|)."""
    RECORDER.count(f"{op}.shadow_compared")
    tol = world * EPS[stock.dtype]
    ok = ring.shape == stock.shape
    if ok and stock.numel():
        ref = stock.float()
        ok = bool(((ring.float() - ref).abs() <= tol * (ref.abs() + ref.abs().max())).all())
    if not ok:
        RECORDER.count(f"{op}.shadow_mismatch")


def _stock(op: str, x: torch.Tensor, run: Callable[[], torch.Tensor], path: str) -> torch.Tensor:
    start = time.perf_counter()
    out = run()
    RECORDER.record(op, path, tuple(x.shape), dtype_name(x), time.perf_counter() - start)
    return out


def make_all_reduce(stock: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap ``stock(self, input_)``; on CPU the result lands in ``input_`` as upstream's does."""

    def all_reduce(self: Any, input_: torch.Tensor) -> torch.Tensor:
        ring = ring_for(self, input_)
        if ring is None:
            return _stock("all_reduce", input_, lambda: stock(self, input_), "fallback")
        if MODE["mode"] == "shadow" and capturing(input_):
            return _stock("all_reduce", input_, lambda: stock(self, input_), "shadow_capture")
        out = run_ring("all_reduce", input_, ring.all_reduce)
        if MODE["mode"] == "shadow":
            ref = _stock("all_reduce", input_, lambda: stock(self, input_), "stock")
            compare("all_reduce", out, ref, self.world_size)
            return ref
        if input_.device.type == "cpu":
            input_.copy_(out)
            return input_
        return out

    all_reduce.__wrapped__ = stock  # type: ignore[attr-defined]
    return all_reduce


def make_all_gather(stock: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap ``stock(self, input_, dim)``: ring order is group-rank order, as upstream's."""

    def all_gather(self: Any, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        ring = ring_for(self, input_)
        if ring is None:
            return _stock("all_gather", input_, lambda: stock(self, input_, dim), "fallback")
        d = dim % input_.dim()
        op = "dcp_query_all_gather" if self.unique_name.startswith("dcp:") and d == 1 else "all_gather"
        if MODE["mode"] == "shadow" and capturing(input_):
            return _stock(op, input_, lambda: stock(self, input_, dim), "shadow_capture")
        out = run_ring(op, input_, lambda x: ring.all_gather(x.contiguous(), dim=d, collective=op))
        if MODE["mode"] == "shadow":
            ref = _stock(op, input_, lambda: stock(self, input_, dim), "stock")
            compare(op, out, ref, self.world_size)
            return ref
        return out

    all_gather.__wrapped__ = stock  # type: ignore[attr-defined]
    return all_gather
