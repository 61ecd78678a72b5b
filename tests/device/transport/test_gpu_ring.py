"""Device lane: the GPU-resident ring collectives (transport.gpu) on CUDA streams and graphs.

Ranks are processes on the loopback cable geometry (tcp fabric), rank r on GPU r % count:
four processes on one or two GPUs make a four-rank ring (the ring does not care). NCCL, the
reference, refuses two ranks on one GPU unless each has its own NCCL_HOSTID, which
transport.gpu.nccl_rank_env gives ranks that share a GPU (NCCL then uses its socket transport).

    PYTHONPATH=.:plugins python3 -m pytest -q tests/device/transport

Needs torch with CUDA, nvcc and a C compiler; skips otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "transport"))

from transport_ranks import fault_mid_burn, run_ring

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (1, 7, 4097, 2**20 + 3)
REPLAYS = int(os.environ.get("SPARKRING_GPU_REPLAYS", 1000))


def lane_missing_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    try:
        from transport._native import nvcc

        nvcc()
    except Exception as exc:
        return str(exc)
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "needs a C compiler for the transport's engine"
    return None


@pytest.fixture
def gpu_lane() -> None:
    reason = lane_missing_reason()
    if reason:
        pytest.skip(reason)


def _setup(spec, port, timeout_s=30.0):
    from transport.comm import Communicator

    torch.cuda.set_device(spec.rank % torch.cuda.device_count())
    return Communicator(spec, tcp_port=port, timeout_s=timeout_s)


def _inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + n)
    return (torch.randn(n, generator=gen) * 4).to(dtype)


def captured(fn):
    """(graph, fn's result inside it): fn runs once on a side stream first (registering its plans),
    then is captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float tensor, so comparisons are bitwise (NaN and -0.0 included)."""
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def reference_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """The ring's small-message order on the GPU: exchange (2 ranks) or the two matchings (4),
    each add in fp32 rounded once, as the engine (and transport.reference) do."""

    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.float() + b.float()).to(a.dtype)

    if len(inputs) == 2:
        return add(inputs[0], inputs[1])
    return add(add(inputs[0], inputs[1]), add(inputs[2], inputs[3]))


def host_bytes_and_graphs(spec, port):
    """Eager results equal the host path's bytes; captured collectives replay correctly."""
    from transport.gpu import GpuCollectives

    out: dict = {"mismatch": []}
    with _setup(spec, port) as comm:
        algorithms = ["auto", "ring"] if spec.world == 4 else ["auto"]
        cases = [(n, d, a) for n in SIZES for d in DTYPES for a in algorithms]
        host = {c: comm.all_reduce(_inputs(spec.rank, c[0], c[1]), algorithm=c[2]) for c in cases}
        q = _inputs(spec.rank, 5 * 8 * 64, torch.bfloat16).reshape(5, 8, 64)  # DCP query [tokens, heads, dim]
        gathers = {dim: comm.all_gather(q, dim=dim) for dim in (0, 1)}
        parts = (
            _inputs(spec.rank, 5 * 8 * 64, torch.float32).reshape(5, 8, 64),
            _inputs(spec.rank + 7, 5 * 8, torch.float32).reshape(5, 8),
        )
        combined = comm.lse_combine(*parts)

        gpu = GpuCollectives(comm)
        gpu.pipeline_min_bytes = 1 << 20  # the sizes from 1 MiB run pipelined (by default none is)
        for key, want in host.items():
            got = gpu.all_reduce(_inputs(spec.rank, key[0], key[1]).cuda(), algorithm=key[2]).cpu()
            if not torch.equal(bits(got), bits(want)):
                out["mismatch"].append(str(key))
        for dim, want in gathers.items():
            if not torch.equal(bits(gpu.all_gather(q.cuda(), dim=dim).cpu()), bits(want)):
                out["mismatch"].append(f"all_gather dim {dim}")
        # Every way of waiting and copying gives the same bytes, one after another on one ring.
        for wait in ("spin", "stream", "spin"):
            for fused_max in (0, 1 << 40):
                gpu.wait, gpu.fused_max_bytes = wait, fused_max
                for n in (4097, 2**20 + 3):
                    got = gpu.all_reduce(_inputs(spec.rank, n, torch.float16).cuda()).cpu()
                    if not torch.equal(bits(got), bits(host[(n, torch.float16, "auto")])):
                        out["mismatch"].append(f"{wait} fused<={fused_max} {n}")
        gpu.wait, gpu.fused_max_bytes = "stream", 256 << 10
        got_o, got_l = gpu.lse_combine(parts[0].cuda(), parts[1].cuda())
        out["lse_err"] = max(
            (got_o.cpu() - combined[0]).abs().max().item(), (got_l.cpu() - combined[1]).abs().max().item()
        )

        # Graphs: a 16 KB fp16 all-reduce, an all-gather and a ~4 MB all-reduce (pipelined: its
        # copies in chunks, transport.plan.pipelined) captured, replayed with fresh inputs.
        static = torch.zeros(8192, dtype=torch.float16, device="cuda")
        gstatic = torch.zeros(5, 8, 64, dtype=torch.bfloat16, device="cuda")
        big = torch.zeros(2**21 - 3, dtype=torch.float16, device="cuda")
        graph, (reduced, gathered, big_reduced) = captured(
            lambda: (gpu.all_reduce(static), gpu.all_gather(gstatic, dim=1), gpu.all_reduce(big))
        )
        before = gpu.stats()
        bad = 0
        for i in range(REPLAYS):
            gens = [torch.Generator(device="cuda").manual_seed(i * 16 + r) for r in range(spec.world)]
            xs = [torch.randn(8192, generator=g, device="cuda").half() for g in gens]
            gs = [torch.randn(5, 8, 64, generator=g, device="cuda").bfloat16() for g in gens]
            bs = [torch.randn(big.numel(), generator=g, device="cuda").half() for g in gens]
            static.copy_(xs[spec.rank])
            gstatic.copy_(gs[spec.rank])
            big.copy_(bs[spec.rank])
            graph.replay()
            torch.cuda.synchronize()
            gpu.check("replay")
            bad += int(not torch.equal(bits(reduced), bits(reference_sum(xs))))
            bad += int(not torch.equal(bits(gathered), bits(torch.cat(gs, dim=1))))
            bad += int(not torch.equal(bits(big_reduced), bits(reference_sum(bs))))
        after = gpu.stats()
        out["replays"], out["replay_mismatches"] = REPLAYS, bad
        out["graph_commands"] = {k: after[k] - before[k] for k in ("all_reduce", "all_gather")}
        out["errors"] = after["errors"] + after["refused"]
        gpu.close()
    return out


@pytest.mark.device
@pytest.mark.parametrize("world", [2, 4])
def test_gpu_ring_matches_the_host_path_and_replays_in_graphs(gpu_lane, world):
    for status, res in run_ring(host_bytes_and_graphs, world, 29000 + world, timeout_s=900):
        assert status == "ok", res
        assert res["mismatch"] == []
        assert res["lse_err"] < 1e-5
        assert res["replays"] == REPLAYS and res["replay_mismatches"] == 0
        # Every replay rode the ring: the progress thread counted one command per captured call.
        assert res["graph_commands"] == {"all_reduce": 2 * REPLAYS, "all_gather": REPLAYS}
        assert res["errors"] == 0


BOUND_S = 3.0


def replay_until_failure(rank: int, tcp_port: int, progress, queue) -> None:
    """Replay a captured 16 KB all-reduce until the ring fails; report the error and whether
    the GPU still computes afterwards. SPARKRING_GPU_WAIT (inherited) picks how the stream waits."""
    from transport.errors import TransportError
    from transport.gpu import GpuCollectives
    from transport.topology import cable_geometry

    spec = cable_geometry(rank, 4, "127.77")
    with _setup(spec, tcp_port, BOUND_S) as comm:
        gpu = GpuCollectives(comm)
        static = torch.ones(4096, device="cuda")
        graph, _ = captured(lambda: gpu.all_reduce(static))
        while True:
            start = time.monotonic()
            graph.replay()
            torch.cuda.synchronize()  # the stream completes even when the ring has failed
            try:
                gpu.check("replay")
            except TransportError as exc:
                usable = float(torch.ones(4, device="cuda").sum().item()) == 4.0
                queue.put(
                    (rank, type(exc).__name__, exc.peer_rank, time.monotonic() - start, usable, str(exc))
                )
                return
            progress[rank] += 1


@pytest.mark.device
@pytest.mark.parametrize("wait", ["spin", "stream"])
def test_a_killed_peer_completes_every_survivors_stream_with_an_error_naming_it(gpu_lane, wait, monkeypatch):
    from transport.gpu import mps_active

    if wait == "spin" and torch.cuda.device_count() < 4 and mps_active():
        # Killing an MPS client while its kernel runs faults every client of that GPU (an
        # illegal-address error in the survivors): ranks of one GPU each, as on Sparks, or
        # time-slicing without MPS, are the setups where a spinning kernel's rank can die alone.
        pytest.skip("spinning kernels of ranks sharing a GPU under MPS: run this one without MPS")
    monkeypatch.setenv("SPARKRING_GPU_WAIT", wait)
    reports = fault_mid_burn(replay_until_failure, 4, 29010 + (wait == "stream"), signal.SIGKILL, BOUND_S + 5)
    assert set(reports) == {0, 1, 3}
    for rank, (kind, _peer, waited_s, usable, message) in reports.items():
        assert kind in ("PeerClosedError", "PeerTimeoutError"), message
        assert usable, f"rank {rank}: the GPU did not compute after the failure"
        assert waited_s < BOUND_S + 5.0, (rank, waited_s)
    for rank in (1, 3):
        assert reports[rank][1] == 2, reports[rank]


def nccl_replays(rank: int, world: int) -> dict:
    """Captured ring all-reduce vs NCCL on fresh inputs each replay, bitwise (2 ranks). The
    process group is NCCL, placed by transport.gpu.nccl_rank_env (overlay_ranks)."""
    import torch.distributed as dist

    from transport.comm import Communicator
    from transport.gpu import GpuCollectives
    from transport.topology import cable_geometry

    n = int(os.environ.get("SPARKRING_NCCL_REPLAYS", 10000))
    comm = Communicator(
        cable_geometry(rank, world, "127.77"), tcp_port=int(os.environ["RING_PORT"]), timeout_s=30
    )
    gpu = GpuCollectives(comm)
    static = torch.zeros(8192, dtype=torch.float16, device="cuda")
    graph, ring = captured(lambda: gpu.all_reduce(static))
    gen = torch.Generator(device="cuda").manual_seed(rank)
    bad = 0
    for _ in range(n):
        static.copy_(torch.randn(8192, generator=gen, device="cuda").half())
        graph.replay()
        ref = static.clone()
        dist.all_reduce(ref)
        torch.cuda.synchronize()
        bad += int(not torch.equal(bits(ring), bits(ref)))
    gpu.close()
    comm.close()
    return {"replays": n, "mismatches": bad}


@pytest.mark.device
def test_graph_replays_equal_nccl_bitwise(gpu_lane):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "overlay"))
    from overlay_ranks import free_port, run_group

    for res in run_group(
        nccl_replays, 2, timeout_s=900, backend="nccl", RING_PORT=str(free_port()), NCCL_NVLS_ENABLE="0"
    ):
        assert res["mismatches"] == 0 and res["replays"] == int(
            os.environ.get("SPARKRING_NCCL_REPLAYS", 10000)
        )


def test_reference_sum_is_the_engines_order():
    """The torch reference used above is transport.reference's order (checked on the CPU)."""
    from transport import reference

    gen = torch.Generator().manual_seed(3)
    xs = [(torch.randn(999, generator=gen) * 8).half() for _ in range(4)]
    want = reference.all_reduce([x.numpy() for x in xs], 1)
    assert np.array_equal(reference_sum(xs).numpy().view(np.uint16), want.view(np.uint16))
