"""Build and load the native progress engine (transport/csrc) with the node's C compiler.

The shared objects are compiled on first use into a cache directory keyed by the sha256 of
the sources, the compiler's identity and the flags, so a node builds each version once and a
source change can never load a stale binary. Nothing is ever written into the source tree:

    $SPARKRING_TRANSPORT_CACHE, else $XDG_CACHE_HOME/sparkring/transport, else
    ~/.cache/sparkring/transport  ->  <key>/libsr_engine.so (and libsr_verbs.so, libsr_progress.so,
                                     libsr_gpu.so)

Four ranks starting at once on one host serialise on a lock file; the finished object lands
by atomic rename, so a reader never sees half a file. The ctypes mirrors of the C structs live
here, and each library is checked against them as it loads (transport/layout.py).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transport.layout import check_layout

CSRC = Path(__file__).resolve().parent / "csrc"
CFLAGS = ["-O3", "-g", "-std=gnu11", "-fPIC", "-Wall", "-Wextra", "-Werror"]


class NativeBuildError(RuntimeError):
    """The C compiler is missing or refused the sources."""


class SrError(ctypes.Structure):
    """Mirror of sr_error in csrc/sr_wire.h."""

    _fields_ = [("code", ctypes.c_int), ("peer_rank", ctypes.c_int), ("message", ctypes.c_char * 240)]


class SrLane(ctypes.Structure):
    """Mirror of sr_lane in csrc/sr_wire.h: one send and one receive of a transfer."""

    _fields_ = [
        ("to", ctypes.c_void_p),
        ("sbuf", ctypes.c_void_p),
        ("slen", ctypes.c_size_t),
        ("frm", ctypes.c_void_p),
        ("rbuf", ctypes.c_void_p),
        ("rlen", ctypes.c_size_t),
    ]


class SrDead(ctypes.Structure):
    """Mirror of sr_dead in csrc/sr_wire.h: a dead-peer verdict."""

    _pack_ = 1
    _fields_ = [
        ("dead_rank", ctypes.c_uint16),
        ("reporter", ctypes.c_uint16),
        ("cage", ctypes.c_uint16),
        ("code", ctypes.c_uint16),
        ("addr", ctypes.c_uint32),
        ("silent_ms", ctypes.c_uint32),
        ("at_ms", ctypes.c_uint64),
    ]


MAX_LANES = 4  # SR_MAX_LANES
KEEPER_PEERS = 4  # SR_KEEPER_PEERS
MAX_STRIPES = 4  # SR_MAX_STRIPES: TCP connections per link
MAX_LABELS = 8  # SR_MAX_LABELS: the progress thread's per-label counters
# The progress thread's counters after the per-label ones (sr_progress.c, ST_*; SR_STATS in all).
PROGRESS_STAT_KEYS = ("errors", "refused", "steps", "last_seq", "plan_ns", "input_wait_ns")
RING_SLOTS = 64  # SR_RING_SLOTS
RING_BYTES = 128 + 2 * 64 * RING_SLOTS  # sizeof(sr_cmdring): a header line, the doorbell's, the slots
IN_READY_OFFSET = 12  # offsetof(sr_cmdring, in_ready): the producer's pipeline word


class StepLaneC(ctypes.Structure):
    """Mirror of sr_step_lane (csrc/sr_progress.c)."""

    _fields_ = [
        ("to", ctypes.c_void_p),
        ("soff", ctypes.c_uint64),
        ("slen", ctypes.c_uint64),
        ("frm", ctypes.c_void_p),
        ("roff", ctypes.c_uint64),
        ("rlen", ctypes.c_uint64),
    ]


class StepC(ctypes.Structure):
    """Mirror of sr_step (csrc/sr_progress.c)."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("op", ctypes.c_int32),
        ("nlanes", ctypes.c_int32),
        ("need_in", ctypes.c_uint32),
        ("out_ready", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("lane", StepLaneC * MAX_LANES),
    ]


class CmdC(ctypes.Structure):
    """Mirror of sr_cmd (csrc/sr_cmdring.h)."""

    _fields_ = [
        ("seq", ctypes.c_uint64),
        ("plan", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("pad0", ctypes.c_uint32),
        ("count", ctypes.c_uint64),
        ("in_off", ctypes.c_uint64),
        ("out_off", ctypes.c_uint64),
        ("pad1", ctypes.c_uint64 * 2),
    ]


LANES_ARGTYPES = [
    ctypes.POINTER(SrLane),
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(SrError),
]


class GpuCall(ctypes.Structure):
    """Mirror of sr_gpu_call (csrc/sr_gpu.cu)."""

    _fields_ = [
        ("ring", ctypes.c_void_p),
        ("counter", ctypes.c_void_p),
        ("arena_dev", ctypes.c_void_p),
        ("arena_host", ctypes.c_void_p),
        ("src", ctypes.c_void_p),
        ("dst", ctypes.c_void_p),
        ("in_bytes", ctypes.c_uint64),
        ("out_bytes", ctypes.c_uint64),
        ("count", ctypes.c_uint64),
        ("in_off", ctypes.c_uint64),
        ("out_off", ctypes.c_uint64),
        ("plan", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("fused", ctypes.c_uint32),
        ("wait", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("timeout_ns", ctypes.c_uint64),
        ("status", ctypes.c_void_p),
        ("chunk", ctypes.c_uint64),
    ]


def cache_root() -> Path:
    """Where built objects live (see the module docstring)."""
    explicit = os.environ.get("SPARKRING_TRANSPORT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sparkring" / "transport"


def compiler() -> str:
    """The C compiler: $CC, else cc."""
    cc = os.environ.get("CC", "cc")
    path = shutil.which(cc)
    if not path:
        raise NativeBuildError(f"no C compiler {cc!r} on PATH: install gcc (build-essential) or set CC")
    return path


def _compiler_identity(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cc


def build_key(sources: list[Path], extra: list[str]) -> str:
    """Content key of one build: sources, headers, compiler, flags and machine."""
    cc = compiler()
    h = hashlib.sha256()
    for part in [_compiler_identity(cc), platform.machine(), *CFLAGS, *extra]:
        h.update(part.encode() + b"\0")
    for src in sorted({*sources, *CSRC.glob("*.h")}):
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:20]


def cached_path(name: str, sources: list[Path], extra: list[str], cc: list[str] | None = None) -> Path:
    """Where compile_cached puts (or finds) this build: cache_root()/<key>/name."""
    identity = [_compiler_identity(cc[0]), *cc] if cc else []
    return cache_root() / build_key(sources, [*identity, *extra]) / name


def compile_cached(
    name: str, sources: list[Path], extra: list[str], executable: bool = False, cc: list[str] | None = None
) -> Path:
    """Compile sources into cache_root()/<key>/name unless it is already there.

    ``cc`` replaces the C compiler and CFLAGS (the CUDA library is built by nvcc).
    """
    target = cached_path(name, sources, extra, cc)
    key_dir = target.parent
    if target.exists():
        return target
    key_dir.mkdir(parents=True, exist_ok=True)
    with open(key_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(dir=key_dir, prefix=f".{name}.")
        os.close(fd)
        shape = [] if executable else ["-shared"]
        cmd = [*(cc or [compiler(), *CFLAGS]), *shape, "-I", str(CSRC), "-o", tmp, *map(str, sources), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise NativeBuildError(f"building {name} failed:\n$ {' '.join(cmd)}\n{proc.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class NativeLib:
    """One native library exactly as the transport builds and loads it (the build stage builds
    the same ones on each node: roles/transport_build/files/build_engine.py)."""

    name: str
    sources: tuple[Path, ...]
    extra: tuple[str, ...] = ()
    cc: tuple[str, ...] | None = None  # None: the C compiler with CFLAGS

    def path(self) -> Path:
        return cached_path(
            self.name, list(self.sources), list(self.extra), list(self.cc) if self.cc else None
        )

    def build(self) -> Path:
        return compile_cached(
            self.name, list(self.sources), list(self.extra), cc=list(self.cc) if self.cc else None
        )


ENGINE = NativeLib("libsr_engine.so", (CSRC / "sr_engine.c",))
VERBS = NativeLib("libsr_verbs.so", (CSRC / "sr_verbs.c",), ("-libverbs",))
PROGRESS = NativeLib("libsr_progress.so", (CSRC / "sr_progress.c",), ("-lpthread",))


def gpu_library(arch: str) -> NativeLib:
    """The GPU producer (sr_gpu.cu) for one architecture (sm_121 on GB10, sm_90 on H200)."""
    return NativeLib("libsr_gpu.so", (CSRC / "sr_gpu.cu",), (), tuple(gpu_build_flags(arch)))


def node_libraries(verbs: bool, cuda_arch: str | None) -> list[NativeLib]:
    """What a node runs: the tcp engine and the progress thread, the verbs engine on RoCE, the
    GPU producer where there is a GPU."""
    return [ENGINE, PROGRESS, *([VERBS] if verbs else []), *([gpu_library(cuda_arch)] if cuda_arch else [])]


@functools.cache
def engine() -> ctypes.CDLL:
    """The tcp progress engine with its C signatures declared."""
    lib = ctypes.CDLL(str(ENGINE.build()))
    check_layout(
        lib,
        "sr_engine_layout",
        {"sr_error": SrError, "sr_lane": SrLane, "sr_dead": SrDead},
        {"SR_MAX_LANES": MAX_LANES, "SR_KEEPER_PEERS": KEEPER_PEERS, "SR_MAX_STRIPES": MAX_STRIPES},
    )
    vp, sz, u32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
    lib.sr_abi_version.restype = ctypes.c_int
    for name in ("sr_checksum", "sr_checksum_portable"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp, sz], u32
    for name in ("sr_reduce", "sr_reduce_portable"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp, vp, sz, ctypes.c_int], None
    lib.sr_peer_new.argtypes = [ctypes.c_int] * 4 + [u32, u32]
    lib.sr_peer_new.restype = vp
    lib.sr_peer_free.argtypes = [vp, ctypes.c_int]
    lib.sr_peer_free.restype = None
    lib.sr_peer_abort.argtypes = [vp]
    lib.sr_peer_abort.restype = None
    lib.sr_peer_stats.argtypes = [vp, ctypes.POINTER(ctypes.c_uint64 * 6)]
    lib.sr_peer_stats.restype = None
    lib.sr_peer_stripe.argtypes = [vp, vp, ctypes.c_uint64, ctypes.POINTER(SrError)]
    lib.sr_peer_stripe.restype = ctypes.c_int
    lib.sr_transfer.argtypes = [
        vp,
        vp,
        sz,
        vp,
        vp,
        sz,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(SrError),
    ]
    lib.sr_transfer.restype = ctypes.c_int
    lib.sr_transfer_lanes.argtypes = LANES_ARGTYPES
    lib.sr_transfer_lanes.restype = ctypes.c_int
    lib.sr_peer_describe.argtypes, lib.sr_peer_describe.restype = [vp, u32, ctypes.c_int], None
    lib.sr_keeper_new.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.sr_keeper_new.restype = vp
    lib.sr_keeper_start.argtypes, lib.sr_keeper_start.restype = [vp], ctypes.c_int
    lib.sr_keeper_free.argtypes, lib.sr_keeper_free.restype = [vp], None
    lib.sr_keeper_verdict.argtypes = [vp, ctypes.POINTER(SrDead), ctypes.POINTER(ctypes.c_int)]
    lib.sr_keeper_verdict.restype = ctypes.c_int
    lib.sr_keeper_silence_ms.argtypes = [vp, ctypes.POINTER(ctypes.c_int64 * KEEPER_PEERS)]
    lib.sr_keeper_silence_ms.restype = None
    return lib


@functools.cache
def progress() -> ctypes.CDLL:
    """The command ring's progress thread (sr_progress.c) with its C signatures declared."""
    lib = ctypes.CDLL(str(PROGRESS.build()))
    check_layout(
        lib,
        "sr_progress_layout",
        {"sr_step_lane": StepLaneC, "sr_step": StepC, "sr_cmd": CmdC},
        {
            "SR_RING_SLOTS": RING_SLOTS,
            "SR_MAX_LANES": MAX_LANES,
            "SR_MAX_LABELS": MAX_LABELS,
            "SR_STATS": MAX_LABELS + len(PROGRESS_STAT_KEYS),
            "sr_cmdring": RING_BYTES,
            "sr_cmdring.in_ready": IN_READY_OFFSET,
        },
    )
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    err = ctypes.POINTER(SrError)
    lib.sr_progress_new.argtypes = [vp, vp, u64, vp, vp, ctypes.POINTER(vp), i, i, i, u32]
    lib.sr_progress_new.restype = vp
    lib.sr_progress_add_plan.argtypes = [vp, u32, u32, u32, u64, u64, u64, vp, u32, err]
    lib.sr_progress_add_plan.restype = i
    for name in ("sr_progress_start",):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp], i
    for name in ("sr_progress_stop", "sr_progress_free"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp], None
    lib.sr_progress_pause.argtypes, lib.sr_progress_pause.restype = [vp, i], None
    lib.sr_progress_failure.argtypes, lib.sr_progress_failure.restype = [vp, err], i
    lib.sr_progress_stats.argtypes, lib.sr_progress_stats.restype = [vp, ctypes.POINTER(u64)], None
    lib.sr_progress_submit.argtypes = [vp, u32, i, ctypes.POINTER(u64)]
    lib.sr_progress_submit.restype = i
    lib.sr_ring_post.argtypes, lib.sr_ring_post.restype = [vp, u64, vp, i], i
    lib.sr_ring_wait.argtypes, lib.sr_ring_wait.restype = [vp, u64, i, ctypes.POINTER(i)], i
    return lib


def nvcc() -> str:
    """The CUDA compiler: $NVCC, else nvcc on PATH, else the toolkit's default place."""
    for cand in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and (path := shutil.which(cand)):
            return path
    raise NativeBuildError("no nvcc: install the CUDA toolkit or set NVCC (the GPU command ring needs it)")


def cuda_arch() -> str:
    """sm_XY to build for: $SPARKRING_CUDA_ARCH, else the current GPU's (sm_121 on GB10)."""
    arch = os.environ.get("SPARKRING_CUDA_ARCH")
    if arch:
        return arch
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def gpu_build_flags(arch: str) -> list[str]:
    """nvcc and its flags for the GPU producer library (one architecture, real code only)."""
    num = arch.removeprefix("sm_")
    return [nvcc(), "-O2", "-std=c++17", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{num},code=sm_{num}"]


@functools.cache
def gpu() -> ctypes.CDLL:
    """The GPU producer (sr_gpu.cu), built for this node's GPU, with its C signatures declared."""
    lib = ctypes.CDLL(str(gpu_library(cuda_arch()).build()))
    check_layout(lib, "sr_gpu_layout", {"sr_gpu_call": GpuCall})
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.sr_gpu_host_alloc.argtypes = [i, sz, ctypes.POINTER(vp), ctypes.POINTER(vp)]
    lib.sr_gpu_host_free.argtypes = [vp]
    lib.sr_gpu_counter_new.argtypes = [i, ctypes.POINTER(vp)]
    lib.sr_gpu_counter_free.argtypes = [vp]
    lib.sr_gpu_collective.argtypes = [i, vp, vp]
    for name in (
        "sr_gpu_host_alloc",
        "sr_gpu_host_free",
        "sr_gpu_counter_new",
        "sr_gpu_counter_free",
        "sr_gpu_collective",
    ):
        getattr(lib, name).restype = i
    lib.sr_gpu_error_string.argtypes, lib.sr_gpu_error_string.restype = [i], ctypes.c_char_p
    return lib
