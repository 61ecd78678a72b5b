"""The patch registry: what each patch replaces, and the pins of the image the overlay runs in.

Each wrapper was written against one vLLM release's source (``written_for``). Which vLLM a
runtime image carries, and the sha256 of every upstream file a patch targets there, are the
image's overlay pins: measured in that image by ``playbooks/overlay-pins.yml``, written into
``images/lock.json`` (``overlay_pins``) by a person who read the diffs, and built into the image's
record (``/opt/sparkring/image.json``). A patch is checked by the sha256 of the whole file that
defines its target, read from disk before that module runs: an unpinned vLLM, or a one-byte
change (a point release, a local edit, a different build), means the patched function may no
longer do what the wrapper assumes, so the overlay refuses instead of guessing.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from transport.integrity import sha256_file

# The build record of the image this process runs in (images/build_context.py writes it).
IMAGE_JSON = "/opt/sparkring/image.json"


@dataclass(frozen=True)
class Patch:
    """One upstream target: ``module.qualname`` replaced by ``wrapper(stock)`` (a factory in overlay)."""

    name: str
    written_for: str  # the vLLM release whose source the wrapper was written against
    module: str
    qualname: str
    wrapper: str
    platform: str  # "cpu", "cuda" or "any": installed only where that communicator runs

    @property
    def file(self) -> str:
        """The target's file, relative to the directory that holds the ``vllm`` package."""
        return self.module.replace(".", "/") + ".py"


@dataclass(frozen=True)
class Pins:
    """The lock's overlay pins for one runtime image (``images/lock.json`` ``overlay_pins``)."""

    image: str  # what gave the image its vLLM: the GB10 base by digest, the sim's wheel by sha256
    vllm_version: str  # as importlib.metadata reports it in that image
    wrappers: str  # the ``written_for`` release whose patches these files were judged against
    files: dict[str, str]  # Patch.file -> sha256


@dataclass(frozen=True)
class Mismatch:
    """A patch whose upstream file is missing, unpinned or differs from the pinned one."""

    patch: Patch
    expected: str
    found: str

    def __str__(self) -> str:
        return (
            f"patch {self.patch.name!r} ({self.patch.module}.{self.patch.qualname}): "
            f"expected sha256 {self.expected}, found {self.found}"
        )


class PinsError(ValueError):
    """The image record is unreadable or its pins malformed (a refusal, never a guess)."""


_CPU = "vllm.distributed.device_communicators.cpu_communicator"
_CUDA = "vllm.distributed.device_communicators.cuda_communicator"
_DCP = "vllm.v1.attention.ops.dcp"
_SCHED = "vllm.v1.core.sched.scheduler"
# The vLLM release every wrapper below was written against (images/lock.json vllm.version names the
# vLLM the images install; tests/unit/overlay/test_overlay_registry.py holds the two equal).
V0_32 = "0.32.0"

PATCHES: tuple[Patch, ...] = (
    Patch("cpu-all-reduce", V0_32, _CPU, "CpuCommunicator.all_reduce", "overlay.collectives.make_all_reduce", "cpu"),
    Patch("cpu-all-gather", V0_32, _CPU, "CpuCommunicator.all_gather", "overlay.collectives.make_all_gather", "cpu"),
    Patch("cuda-all-reduce", V0_32, _CUDA, "CudaCommunicator.all_reduce", "overlay.collectives.make_all_reduce", "cuda"),
    Patch("cuda-all-gather", V0_32, _CUDA, "CudaCommunicator.all_gather", "overlay.collectives.make_all_gather", "cuda"),
    Patch("dcp-lse-combine", V0_32, _DCP, "cp_lse_ag_out_rs", "overlay.dcp.make_cp_lse_ag_out_rs", "cuda"),
    Patch("spec-adaptive-depth", V0_32, _SCHED, "Scheduler.__init__", "overlay.speculation.make_scheduler_init", "any"),
    Patch("spec-acceptance-window", V0_32, _SCHED, "Scheduler.make_spec_decoding_stats",
          "overlay.speculation.make_spec_decoding_stats", "any"),
)  # fmt: skip

# The releases wrappers exist for, oldest first.
WRAPPED_RELEASES: tuple[str, ...] = tuple(dict.fromkeys(p.written_for for p in PATCHES))


def patches_for(wrappers: str) -> tuple[Patch, ...]:
    """The patches written against the vLLM release ``wrappers``."""
    return tuple(p for p in PATCHES if p.written_for == wrappers)


def image_json_path() -> str:
    return os.environ.get("SPARKRING_IMAGE_JSON", IMAGE_JSON)


def load_pins(path: str | None = None) -> Pins | None:
    """The pins in the image record, or None when the image was built without any."""
    path = path or image_json_path()
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PinsError(f"cannot read the image record {path}: {exc}; not a SparkRing image?") from None
    pins = record.get("overlay_pins")
    if pins is None:
        return None
    try:
        return Pins(str(pins["image"]), str(pins["vllm_version"]), str(pins["wrappers"]), dict(pins["files"]))
    except (KeyError, TypeError) as exc:
        raise PinsError(f"{path}: overlay_pins is malformed ({exc!r})") from None


def vllm_root() -> Path | None:
    """The directory that holds the installed ``vllm`` package, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def file_sha256(path: Path | None) -> str:
    if path is None or not path.is_file():
        return "<missing>"
    return sha256_file(path)


def verify(patches: tuple[Patch, ...], pins: Pins, root: Path | None = None) -> list[Mismatch]:
    """Every patch whose upstream file (read from disk, never imported) is not the pinned one."""
    root = root or vllm_root()
    found: dict[str, str] = {}
    bad = []
    for patch in patches:
        if patch.file not in found:
            found[patch.file] = file_sha256(root / patch.file if root else None)
        expected = pins.files.get(patch.file, "<unpinned>")
        if found[patch.file] != expected:
            bad.append(Mismatch(patch, expected, found[patch.file]))
    return bad
