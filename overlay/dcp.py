"""Decode context parallel: the LSE-weighted combine through the ring transport.

Upstream ``cp_lse_ag_out_rs`` all-gathers every rank's LSE, rescales its own partial output
(a Triton kernel) and reduce-scatters the outputs over heads. The ring replaces that trio
with one ``lse_combine`` (every rank gathers the partials and combines them in rank order,
identical bytes everywhere) and keeps this rank's slice of heads, which is what the
reduce-scatter leaves. Calls the transport cannot take (no ring, CUDA graph capture,
unsupported dtype) run upstream's function.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from overlay import collectives
from overlay.recorder import RECORDER

LN2 = math.log(2.0)


def ring_lse_combine(
    comm: Any, rank: int, world: int, out: torch.Tensor, lse: torch.Tensor, is_lse_base_on_e: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, D] partial outputs and [B, H] LSEs of this rank's KV shard -> this rank's heads.

    Returns (out [B, H/world, D] in out's dtype, lse [B, H/world] fp32, base as given).
    """
    heads = out.shape[1]
    if heads % world:
        raise ValueError(f"{heads} heads do not split over {world} DCP ranks")
    lse32 = lse.detach().to("cpu", torch.float32).contiguous()
    if not is_lse_base_on_e:
        lse32 = lse32 * LN2
    combined, new_lse = comm.lse_combine(out.detach().to("cpu").contiguous(), lse32)
    if not is_lse_base_on_e:
        new_lse = new_lse / LN2
    per = heads // world
    keep = slice(per * rank, per * (rank + 1))
    return combined[:, keep].contiguous().to(out.device), new_lse[:, keep].contiguous().to(out.device)


def make_cp_lse_ag_out_rs(stock: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap upstream ``cp_lse_ag_out_rs(cp_attn_out, cp_attn_lse, cp_group, ctx, return_lse, ...)``."""

    def cp_lse_ag_out_rs(
        cp_attn_out: torch.Tensor,
        cp_attn_lse: torch.Tensor,
        cp_group: Any,
        ctx: Any = None,
        return_lse: bool = False,
        is_lse_base_on_e: bool = True,
        seq_lens: torch.Tensor | None = None,
        query_start_loc: torch.Tensor | None = None,
    ) -> Any:
        def upstream() -> Any:
            return stock(
                cp_attn_out,
                cp_attn_lse,
                cp_group,
                ctx,
                return_lse,
                is_lse_base_on_e,
                seq_lens,
                query_start_loc,
            )

        comm = cp_group.device_communicator
        ring = None if comm is None or cp_attn_out.ndim != 3 else collectives.ring_for(comm, cp_attn_out)
        if ring is None:
            return upstream()
        from vllm.v1.attention.ops.dcp import mask_dcp_empty_shards_

        lse = cp_attn_lse.contiguous()
        mask_dcp_empty_shards_(lse, seq_lens, query_start_loc)
        start = time.perf_counter()
        out, new_lse = ring_lse_combine(
            ring, cp_group.rank_in_group, cp_group.world_size, cp_attn_out, lse, is_lse_base_on_e
        )
        RECORDER.record(
            "lse_combine",
            "ring",
            tuple(cp_attn_out.shape),
            collectives.dtype_name(cp_attn_out),
            time.perf_counter() - start,
        )
        if collectives.MODE["mode"] == "shadow":
            ref = upstream()
            ref_out = ref[0] if return_lse else ref
            collectives.compare("lse_combine", out, ref_out, cp_group.world_size)
            return ref
        return (out, new_lse.to(cp_attn_lse.dtype)) if return_lse else out

    cp_lse_ag_out_rs.__wrapped__ = stock  # type: ignore[attr-defined]
    return cp_lse_ag_out_rs
