"""Host buffers the collectives accept: numpy arrays and CPU torch tensors.

Everything becomes a contiguous numpy array the engine can address: fp32 and fp16 as
themselves, bf16 (numpy's through ml_dtypes, or torch's) as its raw uint16 bits. ``wrap`` turns a result back
into the caller's type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

F32, F16, BF16 = 0, 1, 2  # enum sr_dtype in csrc/sr_wire.h
_NUMPY_CODES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16}


@dataclass
class HostBuffer:
    """A contiguous numpy view of the caller's data, its dtype code and the way back."""

    array: np.ndarray
    code: int
    wrap: Callable[[np.ndarray], Any]


def as_host_buffer(x: Any) -> HostBuffer:
    """View ``x`` (numpy float32/float16/ml_dtypes bfloat16, torch float32/float16/bfloat16 on the CPU)."""
    if isinstance(x, np.ndarray):
        if x.dtype.name == "bfloat16":  # ml_dtypes' numpy bfloat16: bf16 where torch is not installed
            bf16 = x.dtype
            return HostBuffer(np.ascontiguousarray(x).view(np.uint16), BF16, lambda a: a.view(bf16))
        if x.dtype not in _NUMPY_CODES:
            raise TypeError(
                f"unsupported numpy dtype {x.dtype}: float32, float16 or ml_dtypes' bfloat16 (or torch)"
            )
        return HostBuffer(np.ascontiguousarray(x), _NUMPY_CODES[x.dtype], lambda a: a)
    if type(x).__module__.startswith("torch"):
        import torch

        if x.device.type != "cpu":
            raise TypeError(f"tensor on {x.device}: the host collectives take CPU tensors")
        codes = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}
        if x.dtype not in codes:
            raise TypeError(f"unsupported tensor dtype {x.dtype}: float32, float16 or bfloat16")
        t = x.detach().contiguous()
        if x.dtype == torch.bfloat16:
            return HostBuffer(
                t.view(torch.int16).numpy().view(np.uint16),
                BF16,
                lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16),
            )
        return HostBuffer(t.numpy(), codes[x.dtype], torch.from_numpy)
    raise TypeError(f"unsupported buffer type {type(x).__name__}: a numpy array or a CPU torch tensor")


def bf16_from_bits(bits: np.ndarray) -> Any:
    """bf16 raw bits as a collective's input: a torch bfloat16 tensor, or where torch is not
    installed (the aarch64 lane's root) an ml_dtypes bfloat16 array; the bytes are shared."""
    try:
        import torch
    except ImportError:
        import ml_dtypes

        return np.ascontiguousarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)


def result_bytes(y: Any) -> np.ndarray:
    """A collective's result (numpy array or CPU torch tensor) as a flat uint8 view of its bytes."""
    if isinstance(y, np.ndarray):
        return np.ascontiguousarray(y).view(np.uint8).reshape(-1)
    import torch

    return y.contiguous().view(torch.uint8).numpy().reshape(-1)
