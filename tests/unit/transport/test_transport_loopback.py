"""Multi-process collectives on a loopback ring: byte-exact results, identical on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from transport_ranks import run_ring

from transport import reference
from transport.buffers import BF16, F16, F32, bf16_from_bits, result_bytes
from transport.comm import Communicator, lse_combine_local
from transport.errors import RendezvousError

SIZES = [1, 7, 4096, 100_003]  # elements; odd sizes leave ring chunks of unequal length
CODES = {"float32": F32, "float16": F16, "bfloat16": BF16}


def _input(rank: int, n: int, dtype: str, salt: int = 0) -> np.ndarray:
    x = np.random.default_rng(rank * 1009 + n + salt).standard_normal(n).astype(np.float32) * 3
    if dtype == "bfloat16":
        return reference.f32_to_bf16(x)
    return x.astype(dtype)


def _bits(y) -> np.ndarray:
    return result_bytes(y).copy()


def collectives_rank(spec, tcp_port: int, algorithms: tuple[str, ...], dtypes: tuple[str, ...]) -> dict:
    out = {}
    with Communicator(spec, tcp_port=tcp_port, timeout_s=30, slot_bytes=64 * 1024) as comm:
        for dtype in dtypes:
            for n in SIZES:
                x = _input(spec.rank, n, dtype)
                arg = bf16_from_bits(x) if dtype == "bfloat16" else x
                for algo in algorithms:
                    out[("all_reduce", dtype, n, algo)] = _bits(comm.all_reduce(arg, algo))
                inplace = arg.clone() if hasattr(arg, "clone") else arg.copy()
                assert comm.all_reduce(inplace, out=inplace) is inplace
                assert np.array_equal(_bits(inplace), out[("all_reduce", dtype, n, "auto")])
            q = _input(spec.rank, 3 * 2 * 8, dtype, 1).reshape(3, 2, 8)
            qa = bf16_from_bits(q) if dtype == "bfloat16" else q
            out[("dcp", dtype)] = _bits(comm.dcp_query_all_gather(qa))
            v = _input(spec.rank, 5 * 11, dtype, 2).reshape(5, 11)
            out[("vocab", dtype)] = _bits(
                comm.vocab_all_gather(bf16_from_bits(v) if dtype == "bfloat16" else v)
            )
            lse = np.random.default_rng(spec.rank).standard_normal((3, 2)).astype(np.float32)
            lse[0, 0] = [np.nan, np.inf, -np.inf, 1.0][spec.rank % 4]  # empty shards count as -inf
            lse[1, 1] = -np.inf  # every shard empty here: out 0, lse -inf
            o, new_lse = comm.lse_combine(qa, lse)
            out[("lse", dtype)] = (_bits(o), _bits(new_lse))
        out["stats"] = comm.stats()
    return out


# bf16 (torch or ml_dtypes in every rank) on the four-rank ring only, to keep the spawned ranks light.
@pytest.mark.parametrize(
    ("world", "algorithms", "dtypes", "port"),
    [
        (2, ("auto", "ring"), ("float32", "float16"), 28610),
        (4, ("auto", "matching", "crossed", "ring"), tuple(CODES), 28620),
        (6, ("auto",), ("float32", "float16"), 28630),
    ],
)
def test_collectives_are_byte_exact(
    world: int, algorithms: tuple[str, ...], dtypes: tuple[str, ...], port: int
) -> None:
    results = run_ring(collectives_rank, world, port, algorithms=algorithms, dtypes=dtypes)
    assert all(status == "ok" for status, _ in results), [v for s, v in results if s != "ok"]
    per_rank = [value for _, value in results]
    for dtype in dtypes:
        code = CODES[dtype]
        for n in SIZES:
            inputs = [_input(r, n, dtype) for r in range(world)]
            for algo in algorithms:
                want = reference.all_reduce(inputs, code, algo).view(np.uint8)
                for r in range(world):
                    assert np.array_equal(per_rank[r][("all_reduce", dtype, n, algo)], want), (
                        dtype,
                        n,
                        algo,
                        r,
                    )
        qs = [_input(r, 48, dtype, 1).reshape(3, 2, 8) for r in range(world)]
        vs = [_input(r, 55, dtype, 2).reshape(5, 11) for r in range(world)]
        for r in range(world):
            assert np.array_equal(
                per_rank[r][("dcp", dtype)], np.concatenate(qs, axis=1).view(np.uint8).reshape(-1)
            )
            assert np.array_equal(
                per_rank[r][("vocab", dtype)], np.concatenate(vs, axis=1).view(np.uint8).reshape(-1)
            )
            assert all(
                np.array_equal(per_rank[r][("lse", dtype)][i], per_rank[0][("lse", dtype)][i])
                for i in range(2)
            )
    # Each rank only ever talked to its two ring neighbours.
    for r in range(world):
        assert set(per_rank[r]["stats"]) == {(r + 1) % world, (r - 1) % world}


def test_lse_combine_matches_the_float64_formula() -> None:
    rng = np.random.default_rng(5)
    outs = rng.standard_normal((4, 3, 2, 8)).astype(np.float32)
    lses = (rng.standard_normal((4, 3, 2)) * 5).astype(np.float32)
    lses[2, 0, 0] = np.nan
    lses[3, 0, 1] = np.inf
    lses[:, 2, 1] = -np.inf
    out, lse = lse_combine_local(outs, lses)
    clean = np.where(np.isnan(lses) | (lses == np.inf), -np.inf, lses).astype(np.float64)
    m = clean.max(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.exp(clean - m)
        want = (w[..., None] * outs).sum(axis=0) / w.sum(axis=0)[..., None]
        want_lse = m + np.log(w.sum(axis=0))
    live = np.isfinite(m)
    np.testing.assert_allclose(out[live], want[live], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(lse[live], want_lse[live], rtol=1e-6)
    assert np.all(out[~live] == 0) and np.all(lse[~live] == -np.inf)


def mismatched_rank(spec, tcp_port: int, setting: str, values: tuple[int, int]) -> str:
    with Communicator(spec, tcp_port=tcp_port, setup_timeout_s=10, **{setting: values[spec.rank]}):
        return "connected"


# Ends that differ in a setting both must share; connections per link go in the records' twins.
@pytest.mark.parametrize(
    ("setting", "values", "field", "port"),
    [("window", (8, 16), "window=", 28640), ("connections", (1, 2), "twins=", 28645)],
)
def test_rendezvous_mismatch_names_the_peer(
    setting: str, values: tuple[int, int], field: str, port: int
) -> None:
    results = run_ring(mismatched_rank, 2, port, setting=setting, values=values)
    assert [s for s, _ in results] == ["error", "error"]
    for rank, (_, (name, message, _)) in enumerate(results):
        assert name == RendezvousError.__name__
        assert f"rank {rank ^ 1} at 127.77.0.{2 - rank}" in message
    assert any(field in v[1] for _, v in results)
