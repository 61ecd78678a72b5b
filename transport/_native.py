"""Build and load the native progress engine (transport/csrc) with the node's C compiler.

The shared objects are compiled on first use into a cache directory keyed by the sha256 of
the sources, the compiler's identity and the flags, so a node builds each version once and a
source change can never load a stale binary. Nothing is ever written into the source tree:

    $SPARKRING_TRANSPORT_CACHE, else $XDG_CACHE_HOME/sparkring/transport, else
    ~/.cache/sparkring/transport  ->  <key>/libsr_engine.so (and libsr_verbs.so, layout.json)

Four ranks starting at once on one host serialise on a lock file; the finished object lands
by atomic rename, so a reader never sees half a file.
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
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
CFLAGS = ["-O2", "-g", "-std=gnu11", "-fPIC", "-Wall", "-Wextra", "-Werror"]


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


MAX_LANES = 4  # SR_MAX_LANES
LANES_ARGTYPES = [ctypes.POINTER(SrLane), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.POINTER(SrError)]  # fmt: skip


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


def compile_cached(name: str, sources: list[Path], extra: list[str], executable: bool = False) -> Path:
    """Compile sources into cache_root()/<key>/name unless it is already there."""
    key_dir = cache_root() / build_key(sources, extra)
    target = key_dir / name
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
        cmd = [compiler(), *CFLAGS, *shape, "-I", str(CSRC), "-o", tmp, *map(str, sources), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise NativeBuildError(f"building {name} failed:\n$ {' '.join(cmd)}\n{proc.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target


@functools.cache
def engine() -> ctypes.CDLL:
    """The tcp progress engine with its C signatures declared."""
    lib = ctypes.CDLL(str(compile_cached("libsr_engine.so", [CSRC / "sr_engine.c"], [])))
    vp, sz, u32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
    lib.sr_abi_version.restype = ctypes.c_int
    lib.sr_checksum.argtypes = [vp, sz]
    lib.sr_checksum.restype = u32
    lib.sr_reduce.argtypes = [vp, vp, sz, ctypes.c_int]
    lib.sr_reduce.restype = None
    lib.sr_peer_new.argtypes = [ctypes.c_int] * 4 + [u32, u32]
    lib.sr_peer_new.restype = vp
    lib.sr_peer_free.argtypes = [vp, ctypes.c_int]
    lib.sr_peer_free.restype = None
    lib.sr_peer_stats.argtypes = [vp, ctypes.POINTER(ctypes.c_uint64 * 6)]
    lib.sr_peer_stats.restype = None
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
    return lib
