"""Device lane: the overlay's CUDA path (CudaCommunicator's wrappers) on GPUs.

Stock is torch.distributed as vLLM's CudaCommunicator uses it: NCCL (one GPU per rank, or ranks
sharing a GPU, each its own NCCL_HOSTID, over NCCL's socket transport), or gloo on CUDA tensors. The ring is the transport's GPU
collectives (transport.gpu) over the tcp fabric on the loopback cable geometry
(127.77.i.0/24): eager and captured calls ride it, no host staging. Custom mode must return the
ring's sum on the GPU, shadow mode must agree with stock for every dtype, and a call captured
into a CUDA graph must ride the ring on every replay (the progress thread counts them) and
equal stock's result.

    PYTHONPATH=.:plugins python3 -m pytest -q tests/device/overlay

Needs torch with CUDA, nvcc and a C compiler (the transport's engine); skips otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "overlay"))

from overlay_ranks import run_group

pytestmark = pytest.mark.device
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def gpus_missing_reason(backend: str, world: int) -> str | None:
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < 1:  # NCCL ranks sharing a GPU get their own NCCL_HOSTID (transport.gpu.nccl_rank_env)
        return f"{backend} stock needs a GPU, found none"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "needs a C compiler for the transport's engine"
    try:
        from transport._native import nvcc

        nvcc()
    except Exception as exc:
        return str(exc)
    return None


class StockCommunicator:
    """The three attributes the wrappers read, and stock out-of-place torch.distributed collectives."""

    def __init__(self, unique_name: str) -> None:
        import torch.distributed as dist

        self.unique_name = unique_name
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        out = input_.clone()
        dist.all_reduce(out)
        return out

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        import torch.distributed as dist

        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous())
        return torch.cat(parts, dim=dim)


def _exercise(rank: int, world: int) -> dict:
    from overlay import collectives
    from overlay.recorder import RECORDER

    collectives.MODE["mode"] = os.environ["MODE"]
    reduce = collectives.make_all_reduce(StockCommunicator.all_reduce)
    gather = collectives.make_all_gather(StockCommunicator.all_gather)
    tp = StockCommunicator("tp:0")
    gen = torch.Generator(device="cuda").manual_seed(rank)
    out: dict = {"reduce": {}}
    for dtype in DTYPES:
        for numel in (1, 4097, 1 << 20):
            x = torch.randn(numel, generator=gen, device="cuda").to(dtype)
            stock = StockCommunicator.all_reduce(tp, x)
            got = reduce(tp, x)
            out["reduce"][f"{dtype}/{numel}"] = (
                got.device.type,
                got.dtype == dtype,
                (got.float() - stock.float()).abs().max().item(),
                # Two summation orders may differ by this much (the shadow envelope); 0 on two ranks.
                world * collectives.EPS[dtype] * 2 * stock.float().abs().max().item() if world > 2 else 0.0,
            )
    g = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3) + 10 * rank
    out["gather"] = gather(tp, g, -1).tolist()
    out["counters"] = RECORDER.snapshot("test")["counters"]
    if os.environ["MODE"] == "shadow" and os.environ["BACKEND"] == "gloo":
        return out  # shadow under capture runs stock alone, and gloo (a host collective) cannot be captured
    # A call captured into a CUDA graph rides the ring on every replay.
    static = torch.zeros(4096, dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        reduce(tp, static)  # warm-up outside capture (creates the GPU collectives)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = reduce(tp, static)
    from overlay.ring import GROUPS

    before = GROUPS.stats()["tp:0.progress"]["all_reduce"]
    replays, max_err = 20, 0.0
    for i in range(replays):
        static.copy_(
            torch.randn(
                4096, generator=torch.Generator(device="cuda").manual_seed(i * 2 + rank), device="cuda"
            ).half()
        )
        graph.replay()
        want = StockCommunicator.all_reduce(tp, static)
        torch.cuda.synchronize()
        bound = (
            world * collectives.EPS[torch.float16] * 2 * want.float().abs().max().item() if world > 2 else 0.0
        )
        max_err = max(max_err, (captured.float() - want.float()).abs().max().item() - bound)
    out["captured_err"] = max(max_err, 0.0)
    out["graph_replays_on_ring"] = GROUPS.stats()["tp:0.progress"]["all_reduce"] - before
    out["counters"] = RECORDER.snapshot("test")["counters"]
    return out


@pytest.mark.parametrize("mode", ["custom", "shadow"])
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("world", [2, 4])
def test_overlay_cuda_path(mode: str, backend: str, world: int) -> None:
    reason = gpus_missing_reason(backend, world)
    if reason:
        pytest.skip(reason)
    runs = run_group(
        _exercise, world, timeout_s=600, backend=backend, MODE=mode, BACKEND=backend, SPARKRING_TEST_CUDA="1"
    )
    for res in runs:
        for case, (device, same_dtype, err, bound) in res["reduce"].items():
            # Two ranks: a0 + a1 is one rounding in either order, so ring and stock agree exactly.
            assert device == "cuda" and same_dtype and err <= bound, (case, err, bound)
        assert res["gather"] == [
            [c + 10 * r for r in range(world) for c in row] for row in ([0, 1, 2], [3, 4, 5])
        ]
        c = res["counters"]
        captures = not (mode == "shadow" and backend == "gloo")  # gloo stock cannot be captured
        assert c["all_reduce.ring"] == len(DTYPES) * 3 + captures  # + the warm-up outside capture
        assert c["all_gather.ring"] == 1
        if mode == "custom":
            assert c["all_reduce.graph"] == 1  # captured once, on the ring
            assert res["graph_replays_on_ring"] == 20 and res["captured_err"] == 0.0
        elif captures:  # shadow compares eagerly; under capture it returns stock alone
            assert c["all_reduce.shadow_capture"] == 1 and res["graph_replays_on_ring"] == 0
        if mode == "shadow":
            assert c["all_reduce.shadow_compared"] == len(DTYPES) * 3 + captures
            assert not {k: v for k, v in c.items() if k.endswith("shadow_mismatch")}
