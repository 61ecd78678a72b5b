"""The DCP combine through the ring against full attention over the whole KV, on CPU.

Four ranks (threads, each its own transport communicator on the loopback cable geometry)
each hold one shard of the keys and values, compute partial attention and its LSE for all
heads, and run the overlay's combine; every rank's head slice must equal full attention.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from overlay_ranks import free_port

from overlay.dcp import ring_lse_combine
from transport import Communicator
from transport.topology import cable_geometry

WORLD, TOKENS, HEADS, DIM = 4, 3, 8, 16


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, D], k/v [L, H, D] -> out [B, H, D], lse [B, H] (natural log; -inf for L = 0)."""
    scores = torch.einsum("bhd,lhd->bhl", q, k) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores, dim=-1)
    if k.shape[0] == 0:
        return torch.zeros_like(q), lse
    return torch.einsum("bhl,lhd->bhd", torch.softmax(scores, dim=-1), v), lse


def run_ranks(fn, world: int = WORLD) -> list:
    port, results, errors = free_port(), [None] * world, []

    def one(rank: int) -> None:
        try:
            with Communicator(cable_geometry(rank, world, "127.77"), tcp_port=port, timeout_s=60) as comm:
                results[rank] = fn(comm, rank)
        except BaseException as exc:  # reported by the main thread
            errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


@pytest.mark.parametrize("shard_lens", [(37, 41, 29, 53), (50, 0, 61, 7)], ids=["even", "empty-shard"])
@pytest.mark.parametrize("base_e", [True, False], ids=["lse-base-e", "lse-base-2"])
def test_ring_combine_equals_full_attention(shard_lens: tuple[int, ...], base_e: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(TOKENS, HEADS, DIM, generator=gen)
    k = torch.randn(sum(shard_lens), HEADS, DIM, generator=gen)
    v = torch.randn(sum(shard_lens), HEADS, DIM, generator=gen)
    full_out, full_lse = attention(q, k, v)
    bounds = [0, *torch.tensor(shard_lens).cumsum(0).tolist()]

    def combine(comm: Communicator, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = bounds[rank], bounds[rank + 1]
        out, lse = attention(q, k[lo:hi], v[lo:hi])
        return ring_lse_combine(comm, rank, WORLD, out, lse if base_e else lse / math.log(2), base_e)

    per = HEADS // WORLD
    results = run_ranks(combine)
    for rank, (out, lse) in enumerate(results):
        heads = slice(per * rank, per * (rank + 1))
        assert out.shape == (TOKENS, per, DIM) and lse.shape == (TOKENS, per)
        torch.testing.assert_close(out, full_out[:, heads], rtol=1e-5, atol=1e-5)
        want_lse = full_lse[:, heads] if base_e else full_lse[:, heads] / math.log(2)
        torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)


def test_ring_combine_refuses_heads_that_do_not_split() -> None:
    def combine(comm: Communicator, rank: int) -> str:
        with pytest.raises(ValueError, match="6 heads do not split over 4 DCP ranks"):
            ring_lse_combine(comm, rank, WORLD, torch.zeros(1, 6, 4), torch.zeros(1, 6))
        return "refused"

    assert run_ranks(combine) == ["refused"] * WORLD
