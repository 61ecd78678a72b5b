"""Numpy references for the collectives, written independently of the C engine.

They follow the reduction order that transport.schedule defines, with the engine's rule
for half types (widen both to fp32, add, round to nearest even once), so a correct
transport matches them byte for byte. Burns and tests compare against these.
"""

from __future__ import annotations

import numpy as np

from transport.buffers import BF16, F16, F32
from transport.schedule import RING_DIRECTIONS, allreduce_algorithm, chunk_bounds, ring_halves


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


NAN_MADE = np.uint32(0xFFC00000)  # SR_NAN_MADE: the NaN of inf + -inf on every CPU (x86's)


def add_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b in fp32, except that two NaNs give the larger of their quieted bit patterns, and a
    NaN the add makes (inf + -inf) is NAN_MADE.

    Hardware returns one operand's NaN, and the two ends of an exchange add in opposite
    orders; the engine's rule (sr_add in csrc/sr_wire.h) makes both ends agree, and an x86
    host and an Arm node write the same NaN.
    """
    total = a + b
    if total.dtype != np.float32:  # e.g. strings that trace the order of the adds
        return total
    a_nan, b_nan = np.isnan(a), np.isnan(b)
    both, made = a_nan & b_nan, np.isnan(total) & ~a_nan & ~b_nan
    if not (both.any() or made.any()):
        return total
    quiet_a, quiet_b = (np.ascontiguousarray(x).view(np.uint32) | 0x00400000 for x in (a, b))
    total = np.where(made, NAN_MADE.view(np.float32), total)
    return np.where(both, np.maximum(quiet_a, quiet_b).view(np.float32), total)


def add(a: np.ndarray, b: np.ndarray, code: int) -> np.ndarray:
    """One element-wise add with the engine's rounding rule."""
    if code == F32:
        return add_f32(a, b)
    if code == F16:
        return add_f32(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    if code == BF16:
        return f32_to_bf16(add_f32(bf16_to_f32(a), bf16_to_f32(b)))
    raise ValueError(f"unknown dtype code {code}")


def all_reduce(inputs: list[np.ndarray], code: int, algorithm: str = "auto") -> np.ndarray:
    """The all-reduce result every rank must hold, in the schedule's order."""
    world = len(inputs)
    algo = allreduce_algorithm(world, inputs[0].nbytes, algorithm)
    if algo == "exchange":
        return add(inputs[0], inputs[1], code)
    if algo == "matching":
        return add(add(inputs[0], inputs[1], code), add(inputs[2], inputs[3], code), code)
    if algo == "crossed":
        flat = [x.reshape(-1) for x in inputs]
        (a, b), (c, d) = ring_halves(flat[0].size)
        first = add(add(flat[0][a:b], flat[1][a:b], code), add(flat[2][a:b], flat[3][a:b], code), code)
        second = add(add(flat[0][c:d], flat[3][c:d], code), add(flat[1][c:d], flat[2][c:d], code), code)
        return np.concatenate([first, second]).reshape(inputs[0].shape)
    flat = [x.reshape(-1) for x in inputs]
    out = np.empty_like(flat[0])
    for d, (base, end) in zip(RING_DIRECTIONS, ring_halves(flat[0].size), strict=True):
        for c, (lo, hi) in enumerate(chunk_bounds(end - base, world)):
            acc = flat[c][base + lo : base + hi]
            for k in range(1, world):
                acc = add(acc, flat[(c + d * k) % world][base + lo : base + hi], code)
            out[base + lo : base + hi] = acc
    return out.reshape(inputs[0].shape)
