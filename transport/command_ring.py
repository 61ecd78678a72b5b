"""The command ring: a communicator's links driven by the native progress thread.

A producer posts commands (which registered plan to run) on a 64-slot ring in memory both
sides see; the progress thread (csrc/sr_progress.c) runs each plan over the communicator's
fabric on one arena and answers it. The GPU is one producer (transport.gpu: a kernel on the
caller's stream, capturable into CUDA graphs); this module's host producer is another (the
tests, the rxe lane, and anyone who wants the host path without Python between steps).

While a ring drives a communicator it owns its links: the communicator's own collectives
refuse to run (two writers on one link would interleave frames). A failure anywhere marks
the ring failed; the next call raises naming the peer, as the host collectives do.
"""

from __future__ import annotations

import ctypes
import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport import plan as plans
from transport._native import (
    IN_READY_OFFSET,
    MAX_LABELS,
    PROGRESS_STAT_KEYS,
    RING_BYTES,
    CmdC,
    SrError,
    StepC,
    progress,
)
from transport.buffers import as_host_buffer
from transport.errors import PeerTimeoutError, TransportError

RING_REGION = 16384  # the ring, then the GPU's status word, before the arena
STATUS_OFFSET = RING_BYTES + 128  # the GPU's status word: its own cache line after the ring
ANSWER_MARGIN_S = 5.0  # a waiter's bound past the progress thread's own


@dataclass
class RingMemory:
    """Where the ring and the arena live: host addresses (the progress thread's), and the
    GPU's addresses of the same bytes when a GPU maps them (0 otherwise)."""

    ring: int
    arena: int
    arena_bytes: int
    ring_dev: int = 0
    arena_dev: int = 0
    keep: Any = None  # the owner of the memory (freed with the ring)

    def arena_view(self) -> np.ndarray:
        return np.ctypeslib.as_array((ctypes.c_uint8 * self.arena_bytes).from_address(self.arena))


def host_memory(arena_bytes: int) -> RingMemory:
    """Ring and arena in anonymous host memory (page-aligned, zeroed): the host producer's."""
    region = mmap.mmap(-1, RING_REGION + arena_bytes)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    return RingMemory(base, base + RING_REGION, arena_bytes, keep=region)


class CommandRing:
    """One communicator's links, one arena, one progress thread; plans registered once per shape."""

    def __init__(self, comm: Any, memory: RingMemory, *, spin_us: int = 200, max_plans: int = 1024) -> None:
        self.comm, self.memory, self.lib = comm, memory, progress()
        self.rank, self.world = comm.rank, comm.world
        self.adds_in_place = comm.fabric.adds_in_place
        handles = [link.handle.value for link in comm.links.values()]
        peers = (ctypes.c_void_p * max(1, len(handles)))(*handles)
        transfer = ctypes.cast(comm.fabric.transfer_lanes, ctypes.c_void_p)
        abort = getattr(comm.fabric, "abort_peer", None)
        self._timeout_s = comm.timeout_s
        self._handle = self.lib.sr_progress_new(
            memory.ring,
            memory.arena,
            memory.arena_bytes,
            transfer,
            ctypes.cast(abort, ctypes.c_void_p) if abort is not None else None,
            peers,
            len(handles),
            int(comm.timeout_s * 1000),
            spin_us,
            max_plans,
        )
        if not self._handle:
            raise ValueError("the progress thread refused its arguments (ring, arena, peers, timeout)")
        self._plans: dict[tuple, tuple[int, plans.Plan]] = {}
        comm.attach_driver(self)
        if self.lib.sr_progress_start(self._handle):
            raise TransportError("could not start the progress thread")

    # -- plans, posting and answers ------------------------------------------------------

    def register(self, plan: plans.Plan) -> int:
        """The plan's id with the progress thread (registered on first use of its shape)."""
        key = (plan.kind, plan.label, plan.code, plan.count, plan.steps)
        known = self._plans.get(key)
        if known is not None:
            return known[0]
        if plan.arena_bytes > self.memory.arena_bytes:
            raise ValueError(
                f"{plan.label} of {plan.count} elements needs a {plan.arena_bytes}-byte arena; this ring has "
                f"{self.memory.arena_bytes} (raise arena_bytes)"
            )
        steps = (StepC * max(1, len(plan.steps)))()
        for c_step, step in zip(steps, plan.steps, strict=False):
            c_step.kind, c_step.op, c_step.nlanes = step.kind, step.op, len(step.lanes)
            c_step.need_in, c_step.out_ready = step.need_in, step.out_ready
            for c_lane, lane in zip(c_step.lane, step.lanes, strict=False):
                c_lane.to = self._peer(lane.to)
                c_lane.frm = self._peer(lane.frm)
                c_lane.soff, c_lane.slen, c_lane.roff, c_lane.rlen = (
                    lane.soff,
                    lane.slen,
                    lane.roff,
                    lane.rlen,
                )
        err = SrError()
        label = plans.LABELS.index(plan.label)
        pid = self.lib.sr_progress_add_plan(
            self._handle,
            plan.kind,
            plan.code,
            label,
            plan.count,
            plan.in_off,
            plan.out_off,
            steps,
            len(plan.steps),
            ctypes.byref(err),
        )
        if pid < 0:
            raise ValueError(err.message.decode(errors="replace"))
        self._plans[key] = (pid, plan)
        return pid

    def _peer(self, rank: int | None) -> int | None:
        return None if rank is None else self.comm.links[rank].handle.value

    def submit(self, plan_id: int) -> int:
        """Post a registered plan as the host producer; returns its sequence number."""
        seq = ctypes.c_uint64()
        rc = self.lib.sr_progress_submit(
            self._handle, plan_id, int(self._timeout_s * 1000), ctypes.byref(seq)
        )
        if rc:
            self.check("submit")
            raise PeerTimeoutError(
                f"command ring on rank {self.rank} stayed full for {self._timeout_s:.0f} s"
            )
        return seq.value

    def wait(self, seq: int, collective: str) -> None:
        """Wait (bounded) for the answer to ``seq``; raise naming the peer on a failure."""
        bound_ms = int((self._timeout_s + ANSWER_MARGIN_S) * 1000)
        status = self.lib.sr_ring_wait(self.memory.ring, seq, bound_ms, None)
        if status == 0:
            return
        self.check(collective)
        raise PeerTimeoutError(
            f"{collective} on rank {self.rank}: the progress thread gave no answer to command {seq} "
            f"within {bound_ms} ms",
            collective=collective,
        )

    def failure(self) -> SrError | None:
        err = SrError()
        return err if self.lib.sr_progress_failure(self._handle, ctypes.byref(err)) else None

    def check(self, collective: str) -> None:
        """Raise (and close the communicator) if the ring has failed."""
        err = self.failure()
        if err is not None:
            self.comm.fail_from(collective, err)

    def stats(self) -> dict[str, int]:
        """Commands completed per label, then errors, refused commands, engine steps, last sequence,
        the ns spent running plans and the ns of it pipelined steps waited for input chunks."""
        out = (ctypes.c_uint64 * (MAX_LABELS + len(PROGRESS_STAT_KEYS)))()
        self.lib.sr_progress_stats(self._handle, out)
        counts = {label: out[i] for i, label in enumerate(plans.LABELS)}
        counts.update({key: out[MAX_LABELS + i] for i, key in enumerate(PROGRESS_STAT_KEYS)})
        return counts

    def pause(self, paused: bool) -> None:
        """Test hook: a paused progress thread leaves the ring alone (to fill it, or stall a rank)."""
        self.lib.sr_progress_pause(self._handle, int(paused))

    def post_raw(self, seq: int, cmd: CmdC, timeout_ms: int) -> int:
        """Test hook: post ``cmd`` as ``seq`` exactly as a producer would (no checks)."""
        return self.lib.sr_ring_post(self.memory.ring, seq, ctypes.byref(cmd), timeout_ms)

    def close(self) -> None:
        """Stop the thread and free it (idempotent); the communicator keeps its links."""
        if self._handle:
            self.lib.sr_progress_free(self._handle)
            self._handle = None
            self.comm.detach_driver(self)

    # -- the host producer's collectives ------------------------------------------------

    def _run(self, plan: plans.Plan, data: np.ndarray) -> np.ndarray:
        self.check(plan.label)
        pid = self.register(plan)
        arena = self.memory.arena_view()
        arena[plan.in_off : plan.in_off + plan.in_bytes] = data.reshape(-1).view(np.uint8)
        if plan.chunk:  # the whole input is there at once: every chunk is ready
            ctypes.c_uint32.from_address(self.memory.ring + IN_READY_OFFSET).value = -(
                -plan.in_bytes // plan.chunk
            )
        self.wait(self.submit(pid), plan.label)
        return arena[plan.out_off : plan.out_off + plan.out_bytes].copy()

    def all_reduce(self, x: Any, algorithm: str = "auto", chunk: int = 0) -> Any:
        """Sum over all ranks through the progress thread; the host communicator's bytes.

        ``chunk`` > 0 runs the pipelined plan (plan.pipelined) the GPU producer uses for large
        messages: the same bytes, in pieces of ``chunk``."""
        buf = as_host_buffer(x)
        p = plans.all_reduce(self.rank, self.world, buf.array.size, buf.code, algorithm, self.adds_in_place)
        if chunk:
            p = plans.pipelined(p, chunk)
        out = self._run(p, buf.array).view(buf.array.dtype).reshape(buf.array.shape)
        return buf.wrap(out)

    def all_gather(self, x: Any, dim: int = 0, collective: str = "all_gather") -> Any:
        """Concatenate every rank's ``x`` along ``dim`` in rank order."""
        buf = as_host_buffer(x)
        p = plans.all_gather(self.rank, self.world, buf.array.size, buf.code, collective)
        blocks = self._run(p, buf.array).view(buf.array.dtype).reshape(self.world, *buf.array.shape)
        return buf.wrap(np.concatenate(list(blocks), axis=dim))
