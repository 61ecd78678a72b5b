"""Golden vectors: fixed inputs and the results an x86 host computed for them, held byte for byte
on every CPU (tests/unit/transport/test_golden.py; the aarch64 lane runs it on an emulated arm64).

The inputs are stored, not regenerated from a seed on the checking machine (numpy's normal
sampler calls libm on its rare tail, which need not round alike on every CPU). The results come
from the engine's own reduction (sr_reduce) and from a four-rank loopback ring of Communicators, one
thread each (all-reduce by matchings and by the two half-rings, all-gather, the DCP and vocab gathers, LSE
combine), in fp32, fp16 and bf16, with NaN, inf, -0, subnormal and overflowing values mixed in.

    python tests/unit/transport/golden_vectors.py write     # x86 only; then commit golden/*

writes golden/inputs.npz, golden/results.npz and golden/index.json (their sha256, and where and
with what the results were made).
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
WORLD = 4
TCP_PORT = 28740
DTYPES = ("float32", "float16", "bfloat16")
SIZES = (7, 4099)  # elements: one partial vector and odd ring chunks
EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3e38, 7e4, 6e-8, -65504.0, 1e-7])


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    """fp32 values of every magnitude; one in 50 an edge value."""
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 5, n)).astype(np.float32)
    edge = rng.random(n) < 0.02
    x[edge] = rng.choice(EDGES, int(edge.sum())).astype(np.float32)
    return x


def _as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values as the dtype's storage (bf16 as its uint16 bits)."""
    from transport import reference

    with np.errstate(over="ignore"):
        return reference.f32_to_bf16(x) if dtype == "bfloat16" else x.astype(dtype)


def make_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2025)
    out: dict[str, np.ndarray] = {}
    for dtype in DTYPES:
        for name in ("d", "s"):  # sr_reduce's two operands: 4096 + 37 elements
            out[f"reduce/{dtype}/{name}"] = _as_dtype(_values(rng, 4133), dtype)
        for n in SIZES:
            out[f"all_reduce/{dtype}/{n}"] = np.stack(
                [_as_dtype(_values(rng, n), dtype) for _ in range(WORLD)]
            )
        out[f"gather/{dtype}"] = np.stack([_as_dtype(_values(rng, 3 * 2 * 8), dtype) for _ in range(WORLD)])
        out[f"lse_out/{dtype}"] = np.stack([_as_dtype(_values(rng, 3 * 4 * 8), dtype) for _ in range(WORLD)])
    lse = (rng.standard_normal((WORLD, 3, 4)) * 8).astype(np.float32)
    lse[0, 0, 0], lse[1, 0, 1], lse[:, 2, 3] = np.nan, np.inf, -np.inf  # empty shards, an all-empty row
    out["lse"] = lse
    return out


def _reduce(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from transport._native import engine
    from transport.buffers import BF16, F16, F32

    out = {}
    for dtype, code in zip(DTYPES, (F32, F16, BF16), strict=True):
        d, s = inputs[f"reduce/{dtype}/d"].copy(), inputs[f"reduce/{dtype}/s"]
        engine().sr_reduce(d.ctypes.data, s.ctypes.data, d.nbytes, code)
        out[f"reduce/{dtype}"] = d
    return out


def _arg(x: np.ndarray, dtype: str):
    from transport.buffers import bf16_from_bits

    return bf16_from_bits(x) if dtype == "bfloat16" else x


def ring_rank(spec, tcp_port: int, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One rank's results on the loopback ring."""
    from transport.buffers import result_bytes
    from transport.comm import Communicator

    r, out = spec.rank, {}
    with Communicator(spec, tcp_port=tcp_port, timeout_s=120, slot_bytes=16 * 1024) as comm:
        for dtype in DTYPES:
            for n in SIZES:
                x = inputs[f"all_reduce/{dtype}/{n}"][r]
                for algo in ("matching", "ring"):
                    out[f"all_reduce/{dtype}/{n}/{algo}"] = result_bytes(
                        comm.all_reduce(_arg(x, dtype), algo)
                    )
            g = inputs[f"gather/{dtype}"][r]
            out[f"all_gather/{dtype}"] = result_bytes(comm.all_gather(_arg(g.reshape(3, 16), dtype)))
            out[f"dcp_query_all_gather/{dtype}"] = result_bytes(
                comm.dcp_query_all_gather(_arg(g.reshape(3, 2, 8), dtype))
            )
            out[f"vocab_all_gather/{dtype}"] = result_bytes(
                comm.vocab_all_gather(_arg(g.reshape(6, 8), dtype))
            )
            o, lse = comm.lse_combine(
                _arg(inputs[f"lse_out/{dtype}"][r].reshape(3, 4, 8), dtype), inputs["lse"][r]
            )
            out[f"lse_combine/{dtype}/out"], out[f"lse_combine/{dtype}/lse"] = (
                result_bytes(o),
                result_bytes(lse),
            )
    return {k: v.copy() for k, v in out.items()}


def _ring(inputs: dict[str, np.ndarray]) -> list[tuple[str, object]]:
    """ring_rank for every rank, each on its own thread of this process (the engine runs without
    the GIL), so the ring costs no process start-ups and one torch import at most."""
    from transport_ranks import PREFIX

    from transport.topology import cable_geometry

    ranks: list[tuple[str, object]] = [("error", "no report")] * WORLD

    def run(r: int) -> None:
        try:
            ranks[r] = ("ok", ring_rank(cable_geometry(r, WORLD, PREFIX), TCP_PORT, inputs))
        except Exception as exc:  # the caller reports every rank's failure
            ranks[r] = ("error", f"rank {r}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)  # each collective is bounded by its own timeout_s; this only catches a hang
    return ranks


def compute(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every golden result for ``inputs`` on this machine; a ring result must agree on all ranks."""
    results = _reduce(inputs)
    ranks = _ring(inputs)
    failed = [value for status, value in ranks if status != "ok"]
    if failed:
        raise RuntimeError(f"the loopback ring failed: {failed}")
    first = ranks[0][1]
    assert isinstance(first, dict)
    for r, (_, value) in enumerate(ranks):
        assert isinstance(value, dict)
        differ = [k for k in first if not np.array_equal(value[k], first[k])]
        if differ:
            raise RuntimeError(f"rank {r} differs from rank 0 in {differ}")
    return {**results, **first}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write() -> None:
    if platform.machine() != "x86_64":
        sys.exit(
            f"golden vectors are made on x86_64 (this is {platform.machine()}): they hold other CPUs to it"
        )
    GOLDEN.mkdir(exist_ok=True)
    inputs = make_inputs()
    results = compute(inputs)
    np.savez_compressed(GOLDEN / "inputs.npz", **inputs)
    np.savez_compressed(GOLDEN / "results.npz", **results)
    index = {
        "files": {name: sha256(GOLDEN / name) for name in ("inputs.npz", "results.npz")},
        "made_on": {
            "machine": platform.machine(),
            "numpy": np.__version__,
            "reduce_path": "avx2+f16c" if _has_avx2_f16c() else "portable",
        },
        "command": "python tests/unit/transport/golden_vectors.py write",
    }
    (GOLDEN / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {len(inputs)} inputs and {len(results)} results into {GOLDEN}")


def _has_avx2_f16c() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx2" in flags and "f16c" in flags


if __name__ == "__main__":
    if sys.argv[1:] != ["write"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(HERE))
    write()
