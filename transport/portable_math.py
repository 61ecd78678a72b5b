"""exp and log that give the same bits on every CPU, for the LSE combine.

numpy's float32 exp and log are SIMD approximations that differ by CPU: measured on this
machine, 20% of np.exp(float32) results differ from the correctly rounded ones with AVX-512,
and an aarch64 node takes libm's instead. These are built from IEEE basic operations in
float64 (add, multiply, divide, rint, frexp, ldexp), which every CPU rounds alike, and numpy
never fuses two ufuncs into an FMA; so an x86 host and a Spark combine to the same bytes.
"""

from __future__ import annotations

import numpy as np

LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: k * LN2_HI is exact for |k| < 2^20
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
SQRT_HALF = 0.70710678118654752440
EXP_FLOOR = -200.0  # exp(-200) ~ 1e-87: as a weight against exp(0) = 1 it is below float32's reach
EXP_TERMS = 14  # Taylor terms of e^r, |r| <= ln2/2: the first left out is < 4e-18
LOG_TERMS = 13  # atanh series terms of log m, m in [sqrt(1/2), sqrt(2)): the first left out is < 2e-21


def exp_nonpositive(x: np.ndarray) -> np.ndarray:
    """e^x in float64 for x <= 0 (-inf included); 0 below EXP_FLOOR."""
    x = np.asarray(x, dtype=np.float64)
    live = x >= EXP_FLOOR
    xs = np.where(live, x, 0.0)
    k = np.rint(xs * INV_LN2)
    r = (xs - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, 1.0 / np.prod(np.arange(1, EXP_TERMS, dtype=np.float64)))
    for n in range(EXP_TERMS - 2, -1, -1):  # Horner over 1/n!
        p = p * r + 1.0 / np.prod(np.arange(1, n + 1, dtype=np.float64))
    return np.where(live, np.ldexp(p, k.astype(np.int64)), 0.0)


def log_positive(x: np.ndarray) -> np.ndarray:
    """ln x in float64 for finite x > 0: x = m 2^e, ln m = 2 atanh((m - 1) / (m + 1))."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    low = m < SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    series = np.full_like(z, 1.0 / (2 * LOG_TERMS - 1))
    for n in range(LOG_TERMS - 2, -1, -1):
        series = series * z + 1.0 / (2 * n + 1)
    return e * LN2_HI + (2.0 * s * series + e * LN2_LO)
