"""The engine's vector adds (AVX2/F16C on x86, NEON on aarch64) give the portable loop's bytes.

The portable loop is the reference (sr_reduce_portable); the node's path is sr_reduce. Inputs are
raw bit patterns, so NaNs of every payload and sign, infinities, subnormals and -0 all occur, and
lengths and offsets leave the vector loops' tails and unaligned addresses their share.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from transport._native import engine
from transport.buffers import BF16, F16, F32

F32_EDGES = np.array(
    [
        0,
        0x80000000,
        1,
        0x807FFFFF,
        0x00800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F800000,
        0xFF800000,
        0x7F800001,
        0x7FC00000,
        0xFFFFFFFF,
        0x7FBFFFFF,
        0x33800000,
        0x477FE000,
        0x477FF000,
        0x38800000,
    ],
    dtype=np.uint32,
)


def _both(d: np.ndarray, s: np.ndarray, code: int) -> tuple[np.ndarray, np.ndarray]:
    fast, portable = d.copy(), d.copy()
    engine().sr_reduce(fast.ctypes.data, s.ctypes.data, fast.nbytes, code)
    engine().sr_reduce_portable(portable.ctypes.data, s.ctypes.data, portable.nbytes, code)
    return fast, portable


def _halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """Every 16-bit pattern, then random ones: n values in a random order."""
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    return rng.permutation(np.concatenate([every, rng.integers(0, 65536, n - 65536, dtype=np.uint16)]))


@pytest.mark.parametrize("code", [F16, BF16])
def test_half_precision_vector_adds_equal_the_portable_loop(code: int) -> None:
    rng = np.random.default_rng(2512 + code)
    n = 4 * 65536 + 13
    d, s = _halves(rng, n), _halves(rng, n)
    for lo, hi in ((0, n), (1, n), (3, 1000), (0, 7), (5, 6)):  # tails and odd offsets
        fast, portable = _both(d[lo:hi], s[lo:hi], code)
        assert np.array_equal(fast, portable), (platform.machine(), code, lo, hi)


def test_fp32_vector_adds_equal_the_portable_loop() -> None:
    rng = np.random.default_rng(2513)
    n = 200_003
    bits = [rng.integers(0, 1 << 32, n, dtype=np.uint32) for _ in range(2)]
    for b in bits:  # a quarter of each side near the edges, to meet each other and normal numbers
        b[rng.integers(0, n, n // 4)] = rng.choice(F32_EDGES, n // 4)
        b[rng.integers(0, n, n // 8)] ^= rng.integers(0, 4, n // 8, dtype=np.uint32)
    d, s = bits
    for lo, hi in ((0, n), (1, n), (3, 1000), (0, 7)):
        fast, portable = _both(d[lo:hi], s[lo:hi], F32)
        assert np.array_equal(fast, portable), (platform.machine(), lo, hi)
