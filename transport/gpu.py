"""GPU-resident ring collectives: stream-ordered, capturable into CUDA graphs.

A collective is enqueued on the caller's current CUDA stream (csrc/sr_gpu.cu): the input is
copied into a pinned host arena the GPU maps (on GB10 the same LPDDR the GPU computes in; the
NIC reads it, since GB10 has no GPUDirect RDMA), a kernel posts a command on the command ring
with a sequence from a device-side counter and waits for the native progress thread
(transport.command_ring) to answer, and the result is copied back. Nothing on the stream
needs the host to run Python, so a CUDA graph replays it with fresh sequence numbers each
time; the reductions are the progress thread's, so the bytes are the host path's.

Rules the caller keeps (as vLLM's custom all-reduce does): one stream at a time per
communicator (commands share the arena and run in order), and the first collective of each
shape happens before capture or during it, never mid-replay. A failure (a dead or stalled
peer) completes the stream with an error status instead of hanging it; ``check`` (which
every call runs first) raises it naming the peer.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import torch

from transport import plan as plans
from transport._native import GpuCall, gpu
from transport.comm import Communicator
from transport.command_ring import RING_REGION, STATUS_OFFSET, CommandRing, RingMemory
from transport.errors import NATIVE_ERRORS, TransportError

CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DEFAULT_ARENA_BYTES = 64 << 20
# At or below this many bytes each way, the copies run inside the one kernel (zero-copy on the
# mapped arena: one graph node); above, the copy engines do them. Chosen by measurement
# (benchmarks/gpu_transport); SPARKRING_GPU_FUSED_MAX overrides it.
FUSED_MAX_BYTES = int(os.environ.get("SPARKRING_GPU_FUSED_MAX", 256 << 10))
# From this many bytes an all-reduce is pipelined: its copies in and out move in chunks
# (plan.pipeline_chunk) that overlap the wire (csrc/sr_gpu.cu, plan.pipelined). Each piece is its
# own engine call: over the tcp fabric's four connections per link whole copies won at two ranks
# and were within 3% at four on one H100 (docs/transport.md), so by default nothing is pipelined.
# SPARKRING_GPU_PIPELINE_MIN sets a threshold (over one connection 64 MB broke even or won).
PIPELINE_MIN_BYTES = int(os.environ.get("SPARKRING_GPU_PIPELINE_MIN", 1 << 62))
KERNEL_MARGIN_NS = 5_000_000_000  # a spinning kernel's own bound past the progress thread's
# How the stream waits for the answer (csrc/sr_gpu.cu): "spin" (one kernel posts and spins on
# the answer under its own bound: one graph node, the lower latency and replay host time in
# benchmarks/gpu_transport) or "stream" (a stream memory operation on the ring's wake word: the
# GPU is free meanwhile, for processes that share a GPU without MPS).
WAIT_MODES = {"stream": 0, "spin": 1}
WAIT_MODE = os.environ.get("SPARKRING_GPU_WAIT", "spin")


def mps_active() -> bool:
    """Whether an MPS daemon runs on this machine (its pipe files outlive it, its process does not)."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("nvidia-cuda-mps", "nvidia-cuda-mps-control"):
                return True
        except OSError:
            continue
    return False


def nccl_rank_env(rank: int, world: int, gpus: int) -> dict[str, str]:
    """NCCL's environment for one rank process, set before its communicator is created.

    With a GPU per rank: stock placement (NVLink multicast off). With fewer GPUs, ranks share
    them (as the ring's do, under MPS), which NCCL refuses: its duplicate-GPU check compares
    host hashes, so each rank gets its own NCCL_HOSTID and becomes its own "host", and NCCL
    connects the ranks through its socket transport on loopback, the host path the ring is
    compared with (benchmarks/gpu_transport, tests/device)."""
    env = {"NCCL_NVLS_ENABLE": "0"}
    if gpus < world:
        env.update(
            NCCL_HOSTID=f"sparkring-rank-{rank}",
            NCCL_NET="Socket",
            NCCL_SOCKET_IFNAME="lo",
            NCCL_P2P_DISABLE="1",
            NCCL_SHM_DISABLE="1",
        )
    return env


def nccl_placement(world: int, gpus: int) -> str:
    """How nccl_rank_env places NCCL's ranks, in words (recorded beside every NCCL figure)."""
    if gpus >= world:
        return f"one GPU per rank ({world} ranks, {gpus} GPUs)"
    return (
        f"{world} ranks on {gpus} GPU(s), rank r on GPU r % {gpus}, a distinct NCCL_HOSTID per rank: "
        "NCCL's socket transport on lo (NCCL_NET=Socket, P2P and SHM off)"
    )


class _MappedRegion:
    """Pinned host memory the GPU maps (cudaHostAlloc mapped+portable), freed with the ring."""

    def __init__(self, lib: ctypes.CDLL, device: int, nbytes: int) -> None:
        host, dev = ctypes.c_void_p(), ctypes.c_void_p()
        rc = lib.sr_gpu_host_alloc(device, nbytes, ctypes.byref(host), ctypes.byref(dev))
        if rc:
            raise RuntimeError(
                f"pinned mapped allocation of {nbytes} bytes failed: {lib.sr_gpu_error_string(rc)}"
            )
        self.lib, self.host, self.dev = lib, host.value, dev.value

    def __del__(self) -> None:
        if getattr(self, "host", None):
            self.lib.sr_gpu_host_free(self.host)
            self.host = None


class GpuCollectives:
    """The ring's all-reduce and all-gathers on CUDA tensors, for one communicator."""

    def __init__(
        self,
        comm: Communicator,
        arena_bytes: int = DEFAULT_ARENA_BYTES,
        device: int | None = None,
        spin_us: int = 2000,
        fused_max_bytes: int = FUSED_MAX_BYTES,
        wait: str = WAIT_MODE,
        pipeline_min_bytes: int = PIPELINE_MIN_BYTES,
    ) -> None:
        if wait not in WAIT_MODES:
            raise ValueError(f"wait mode {wait!r}: one of {sorted(WAIT_MODES)} (SPARKRING_GPU_WAIT)")
        self.lib = gpu()
        self.device = torch.cuda.current_device() if device is None else device
        self.rank, self.world = comm.rank, comm.world
        self.fused_max_bytes, self.wait = fused_max_bytes, wait
        self.pipeline_min_bytes = pipeline_min_bytes
        self._region = _MappedRegion(self.lib, self.device, RING_REGION + arena_bytes)
        memory = RingMemory(
            self._region.host,
            self._region.host + RING_REGION,
            arena_bytes,
            self._region.dev,
            self._region.dev + RING_REGION,
            keep=self._region,
        )
        counter = ctypes.c_void_p()
        rc = self.lib.sr_gpu_counter_new(self.device, ctypes.byref(counter))
        if rc:
            raise RuntimeError(f"device sequence counter: {self.lib.sr_gpu_error_string(rc)}")
        self._counter = counter.value
        self._status = ctypes.c_int32.from_address(self._region.host + STATUS_OFFSET)
        self.ring = CommandRing(comm, memory, spin_us=spin_us)
        self._timeout_ns = int(comm.timeout_s * 1e9) + KERNEL_MARGIN_NS
        self._plans: dict[tuple, tuple[int, plans.Plan]] = {}

    # -- health --------------------------------------------------------------------------

    def check(self, collective: str = "check") -> None:
        """Raise if this communicator has failed (a peer died or stalled, a command was refused)."""
        if self.ring.failure() is not None and not torch.cuda.is_current_stream_capturing():
            # Kernels already queued get the failure's answer while the thread still runs.
            torch.cuda.synchronize(self.device)
        self.ring.check(collective)
        status = self._status.value
        if status:
            cls = NATIVE_ERRORS.get(status, TransportError)
            raise cls(
                f"{collective} on rank {self.rank}: a GPU collective ended with status {status} and the progress "
                "thread reported nothing (its own bound passed first)",
                None,
                collective,
            )

    def stats(self) -> dict[str, int]:
        """The progress thread's counters: commands per collective (eager and graph replays alike)."""
        return self.ring.stats()

    def close(self) -> None:
        """Stop the progress thread and free the counter (the stream must be idle)."""
        torch.cuda.synchronize(self.device)
        self.ring.close()
        if self._counter:
            self.lib.sr_gpu_counter_free(self._counter)
            self._counter = 0

    # -- enqueue ------------------------------------------------------------------------

    def _plan(self, key: tuple, build: Any) -> tuple[int, plans.Plan]:
        known = self._plans.get(key)
        if known is None:
            p = build()
            known = self._plans[key] = (self.ring.register(p), p)
        return known

    def _enqueue(self, collective: str, x: torch.Tensor, out: torch.Tensor, pid: int, p: plans.Plan) -> None:
        mem = self.ring.memory
        fused = max(p.in_bytes, p.out_bytes) <= self.fused_max_bytes
        call = GpuCall(
            mem.ring_dev,
            self._counter,
            mem.arena_dev,
            mem.arena,
            x.data_ptr(),
            out.data_ptr(),
            p.in_bytes,
            p.out_bytes,
            p.count,
            p.in_off,
            p.out_off,
            pid,
            p.kind,
            p.code,
            int(fused),
            WAIT_MODES[self.wait],
            0,
            self._timeout_ns,
            self._region.dev + STATUS_OFFSET,
            p.chunk,
        )
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self.lib.sr_gpu_collective(self.device, stream, ctypes.byref(call))
        if rc:
            raise TransportError(
                f"{collective} on rank {self.rank}: enqueue failed: {self.lib.sr_gpu_error_string(rc).decode()}",
                collective=collective,
            )

    def _input(self, collective: str, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cuda" or x.dtype not in CODES:
            raise TypeError(
                f"{collective}: a CUDA tensor of float32, float16 or bfloat16, not {x.dtype} on {x.device}"
            )
        self.check(collective)
        return x.contiguous()

    def all_reduce(self, x: torch.Tensor, algorithm: str = "auto") -> torch.Tensor:
        """Sum over the ring into a new tensor, on the current stream."""
        x = self._input("all_reduce", x)
        code = CODES[x.dtype]
        nbytes = x.numel() * x.element_size()
        chunk = (
            plans.pipeline_chunk(nbytes)
            if nbytes >= max(self.pipeline_min_bytes, self.fused_max_bytes + 1)
            else 0
        )

        def build() -> plans.Plan:
            p = plans.all_reduce(self.rank, self.world, x.numel(), code, algorithm, self.ring.adds_in_place)
            return plans.pipelined(p, chunk) if chunk else p

        pid, p = self._plan(("all_reduce", x.numel(), code, algorithm, chunk), build)
        out = torch.empty_like(x)
        self._enqueue("all_reduce", x, out, pid, p)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = 0, collective: str = "all_gather") -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order, on the current stream."""
        x = self._input(collective, x)
        code = CODES[x.dtype]
        pid, p = self._plan(
            (collective, x.numel(), code),
            lambda: plans.all_gather(self.rank, self.world, x.numel(), code, collective),
        )
        blocks = torch.empty((self.world, *x.shape), dtype=x.dtype, device=x.device)
        self._enqueue(collective, x, blocks, pid, p)
        d = dim % x.dim()
        shape = list(x.shape)
        shape[d] *= self.world
        return blocks.movedim(0, d).reshape(shape)

    def lse_combine(self, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """DCP: combine partial attention outputs ``out`` [..., D] by their fp32 LSE [...].

        Both are all-gathered, then combined on the GPU in rank order in fp32, as
        transport.comm.lse_combine_local does on the host.
        """
        if lse.dtype != torch.float32:
            raise TypeError("lse must be float32")
        outs = self.all_gather(out, 0, "lse_combine").reshape(self.world, *out.shape)
        lses = self.all_gather(lse, 0, "lse_combine").reshape(self.world, *lse.shape)
        combined, new_lse = lse_combine_torch(outs, lses)
        return combined.to(out.dtype), new_lse


def lse_combine_torch(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transport.comm.lse_combine_local in torch (the same formula, fp32, rank order)."""
    neg_inf = torch.tensor(float("-inf"), device=lses.device)
    lse = torch.where(torch.isnan(lses) | (lses == float("inf")), neg_inf, lses.float())
    m = lse.max(dim=0).values
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp(lse - m_safe)
    total = w.sum(dim=0)
    denom = torch.where(total > 0, total, torch.ones_like(total))
    weighted = torch.where(w[..., None] > 0, w[..., None] * outs.float(), torch.zeros((), device=outs.device))
    combined = weighted.sum(dim=0) / denom[..., None]
    new_lse = torch.where(total > 0, m_safe + torch.log(denom), neg_inf.expand_as(total))
    return combined, new_lse
