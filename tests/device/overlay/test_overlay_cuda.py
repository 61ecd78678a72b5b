"""Device lane: the overlay's CUDA path (CudaCommunicator's wrappers) on two GPUs.

Stock is NCCL through torch.distributed, as vLLM's CudaCommunicator uses it; the ring is the
transport's tcp fabric on the loopback cable geometry (127.77.i.0/24), host-staged. Custom
mode must return the ring's sum on the GPU, shadow mode must agree with NCCL for every
dtype, and a call made while a CUDA graph is being captured must go to stock (host staging
cannot be captured).

    PYTHONPATH=.:plugins python3 -m pytest -q tests/device/overlay

Needs torch with CUDA, two GPUs and a C compiler (the transport's engine); skips otherwise.
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


def gpus_missing_reason() -> str | None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return f"needs two GPUs, found {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "needs a C compiler for the transport's engine"
    return None


class NcclCommunicator:
    """The three attributes the wrappers read, and stock out-of-place NCCL collectives."""

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


def doubled(self: NcclCommunicator, input_: torch.Tensor) -> torch.Tensor:
    """A capturable stand-in for stock, to see which path a capturing call takes."""
    return input_ * 2


def _exercise(rank: int, world: int) -> dict:
    from overlay import collectives
    from overlay.recorder import RECORDER

    collectives.MODE["mode"] = os.environ["MODE"]
    reduce = collectives.make_all_reduce(NcclCommunicator.all_reduce)
    gather = collectives.make_all_gather(NcclCommunicator.all_gather)
    tp = NcclCommunicator("tp:0")
    gen = torch.Generator(device="cuda").manual_seed(rank)
    out: dict = {"reduce": {}}
    for dtype in DTYPES:
        for numel in (1, 4097, 1 << 20):
            x = torch.randn(numel, generator=gen, device="cuda").to(dtype)
            stock = NcclCommunicator.all_reduce(tp, x)
            got = reduce(tp, x)
            out["reduce"][f"{dtype}/{numel}"] = (
                got.device.type,
                got.dtype == dtype,
                (got - stock).abs().max().item(),
            )
    g = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3) + 10 * rank
    out["gather"] = gather(tp, g, -1).tolist()
    # A call during CUDA graph capture goes to stock, never to host staging.
    capturing = collectives.make_all_reduce(doubled)
    static = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        capturing(tp, static)  # warm-up outside capture: the ring
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        captured = capturing(tp, static)
    static.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    out["captured"] = captured.tolist()
    out["counters"] = RECORDER.snapshot("test")["counters"]
    return out


@pytest.mark.parametrize("mode", ["custom", "shadow"])
def test_overlay_cuda_path_on_two_gpus(mode: str) -> None:
    reason = gpus_missing_reason()
    if reason:
        pytest.skip(reason)
    for res in run_group(_exercise, 2, timeout_s=300, backend="nccl", MODE=mode):
        for case, (device, same_dtype, err) in res["reduce"].items():
            # Two ranks: a0 + a1 is one rounding in either order, so ring and NCCL agree exactly.
            assert device == "cuda" and same_dtype and err == 0.0, (case, err)
        assert res["gather"] == [[0, 1, 2, 10, 11, 12], [3, 4, 5, 13, 14, 15]]
        assert res["captured"] == [6.0] * 8  # the captured call is stock's (x * 2), replayed
        c = res["counters"]
        assert c["all_reduce.ring"] == len(DTYPES) * 3 + 1  # + the warm-up outside capture
        assert c["all_reduce.fallback"] == 1  # the capture
        assert c["all_gather.ring"] == 1
        if mode == "shadow":
            assert c["all_reduce.shadow_compared"] == len(DTYPES) * 3 + 1
            assert not {k: v for k, v in c.items() if k.endswith("shadow_mismatch")}
