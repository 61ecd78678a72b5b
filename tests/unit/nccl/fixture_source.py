#!/usr/bin/env python3
"""A tiny NCCL-shaped source archive, its patch and its lock entry, made locally.

The module's behaviour (pins, preimages, no-fuzz patching, build, attestation, idempotence,
check mode) does not depend on which source it builds; a real NCCL build takes minutes on
two cores, this one seconds. It is still a real build: nvcc compiles device code for the
requested NVCC_GENCODE, and the patch changes what the library returns.

    python3 tests/unit/nccl/fixture_source.py OUTDIR   # writes OUTDIR/lock.json too
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

VERSION = "0.0.1-fixture"
SOURCE_DIR = "nccl-fixture-0.0.1"
FILES = {
    "Makefile": (
        "NVCC_GENCODE ?= -gencode=arch=compute_121,code=sm_121\n"
        "CUDA_HOME ?= /usr/local/cuda\n"
        "BUILDDIR ?= $(abspath build)\n"
        "src.build:\n"
        "\tmkdir -p $(BUILDDIR)/lib\n"
        "\t$(CUDA_HOME)/bin/nvcc $(NVCC_GENCODE) -shared -Xcompiler -fPIC "
        "-o $(BUILDDIR)/lib/libnccl.so.2.0.1 src/fixture.cu\n"
        "\tln -sf libnccl.so.2.0.1 $(BUILDDIR)/lib/libnccl.so.2\n"
    ),
    "src/ring.h": "#define SWITCHLESS_RING 0\n",
    "src/fixture.cu": (
        '#include "ring.h"\n'
        "__global__ void fixtureKernel(int* out) { *out = SWITCHLESS_RING; }\n"
        'extern "C" int fixtureSwitchlessRing() { return SWITCHLESS_RING; }\n'
    ),
}
PATCH_BODY = (
    "--- a/src/ring.h\n"
    "+++ b/src/ring.h\n"
    "@@ -1 +1 @@\n"
    "-#define SWITCHLESS_RING 0\n"
    "+#define SWITCHLESS_RING 1\n"
)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_archive(path: Path, files: dict[str, str], top: str = SOURCE_DIR) -> str:
    """A deterministic .tar.gz (fixed owner and mtime) of `files` under `top`; returns its sha256."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for name in ["", *sorted({str(Path(n).parent) for n in files} - {"."})]:
            info = tarfile.TarInfo(f"{top}/{name}".rstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # gzip stores a timestamp; zero it so the same files give the same sha256.
    raw = bytearray(buffer.getvalue())
    raw[4:8] = b"\0\0\0\0"
    path.write_bytes(bytes(raw))
    return sha256(bytes(raw))


def make_fixture(out: Path) -> dict:
    """Write the archive and the patch under `out`; return the lock document that pins them."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{SOURCE_DIR}.tar.gz"
    archive_sha = write_archive(archive, FILES)
    patch = out / "0001-switchless-ring.patch"
    preimage = sha256(FILES["src/ring.h"].encode())
    patch.write_text(
        f"Fixture patch: turn the switch on.\nPreimage-SHA256: {preimage}  src/ring.h\n\n{PATCH_BODY}",
        encoding="utf-8",
    )
    release = {
        "source_url": f"file://{archive}",
        "source_sha256": archive_sha,
        "source_dir": SOURCE_DIR,
        "patches": [{"file": str(patch), "sha256": sha256(patch.read_bytes())}],
    }
    lock = {"nccl": {"default_version": VERSION, "releases": {VERSION: release}}}
    (out / "lock.json").write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")
    return lock


if __name__ == "__main__":
    make_fixture(Path(sys.argv[1]))
