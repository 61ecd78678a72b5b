"""The communicator wrappers against the real stock path (gloo) on a loopback ring.

``GlooCommunicator`` has the three attributes the wrappers read from vLLM's
CpuCommunicator and upstream's exact all-reduce/all-gather bodies over torch.distributed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from overlay_ranks import run_group


class GlooCommunicator:
    """Upstream CpuCommunicator's all_reduce/all_gather, over the default gloo group."""

    def __init__(self, unique_name: str) -> None:
        self.unique_name = unique_name
        self.world_size = dist.get_world_size()
        self.rank_in_group = dist.get_rank()

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(input_)
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_)
        return torch.cat(parts, dim=dim)


def _exercise(rank: int, world: int) -> dict:
    import os

    from overlay import collectives
    from overlay.recorder import RECORDER

    collectives.MODE["mode"] = os.environ["MODE"]
    wrapped_reduce = collectives.make_all_reduce(GlooCommunicator.all_reduce)
    wrapped_gather = collectives.make_all_gather(GlooCommunicator.all_gather)
    tp = GlooCommunicator("tp:0")
    gen = torch.Generator().manual_seed(rank)
    out: dict = {"reduce": {}, "gather": None}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(3, 257, generator=gen).to(dtype)
        expected = GlooCommunicator.all_reduce(tp, x.clone())
        got = wrapped_reduce(tp, x)
        out["reduce"][str(dtype)] = (
            got.data_ptr() == x.data_ptr(),
            (got.float() - expected.float()).abs().max().item(),
        )
    g = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank
    out["gather"] = wrapped_gather(tp, g, -1).tolist()
    ints = torch.full((4,), rank + 1, dtype=torch.int64)  # the transport has no int64: stock
    out["int_sum"] = wrapped_reduce(tp, ints).tolist()
    other = GlooCommunicator("world:0")  # not a TP/DCP group: stock
    out["world_sum"] = wrapped_reduce(other, torch.ones(2)).tolist()
    out["counters"] = RECORDER.snapshot("test")["counters"]
    out["entries"] = RECORDER.snapshot("test")["entries"][:2]
    return out


def test_custom_mode_returns_the_ring_sum_in_place_and_falls_back_per_call() -> None:
    for rank, res in enumerate(run_group(_exercise, 2, MODE="custom")):
        for dtype, (in_place, err) in res["reduce"].items():
            assert in_place, dtype  # upstream's CPU all-reduce reduces into its input
            assert err == 0.0, (dtype, err)  # two ranks: a0 + a1 in both orders
        assert res["gather"] == [[0, 1, 2, 10, 11, 12], [3, 4, 5, 13, 14, 15]]
        assert res["int_sum"] == [3, 3, 3, 3] and res["world_sum"] == [2.0, 2.0]
        c = res["counters"]
        assert c["all_reduce.ring"] == 3 and c["all_gather.ring"] == 1
        assert c["all_reduce.fallback"] == 2
        assert "all_reduce.stock" not in c
        first = res["entries"][0]
        assert (first["rank"], first["seq"], first["op"], first["path"], first["shape"], first["dtype"]) == (
            rank,
            1,
            "all_reduce",
            "ring",
            [3, 257],
            "float32",
        )
        assert first["duration_us"] > 0


def test_shadow_mode_runs_both_returns_stock_and_counts_zero_mismatches() -> None:
    for res in run_group(_exercise, 4, MODE="shadow"):
        for dtype, (in_place, err) in res["reduce"].items():
            assert in_place and err == 0.0, dtype  # stock's result is what shadow returns
        c = res["counters"]
        assert c["all_reduce.ring"] == c["all_reduce.stock"] == c["all_reduce.shadow_compared"] == 3
        assert c["all_gather.shadow_compared"] == 1
        assert "all_reduce.shadow_mismatch" not in c and "all_gather.shadow_mismatch" not in c


def test_shadow_compare_counts_a_difference_beyond_the_envelope(monkeypatch) -> None:
    from overlay import collectives
    from overlay.recorder import FlightRecorder

    rec = FlightRecorder()
    monkeypatch.setattr(collectives, "RECORDER", rec)
    stock = torch.tensor([4.0, -2.0, 0.0], dtype=torch.bfloat16)
    collectives.compare("all_reduce", stock.clone(), stock, 4)  # identical
    collectives.compare("all_reduce", stock + torch.tensor([0.0, 0.0, 0.03]).bfloat16(), stock, 4)  # rounding
    collectives.compare("all_reduce", stock + torch.tensor([0.0, 0.5, 0.0]).bfloat16(), stock, 4)  # wrong
    collectives.compare("all_reduce", stock[:2], stock, 4)  # wrong shape
    assert rec.counters == {"all_reduce.shadow_compared": 4, "all_reduce.shadow_mismatch": 2}
