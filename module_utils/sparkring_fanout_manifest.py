# Copyright: SparkRing contributors. Apache-2.0.
"""What a fan-out moves, known before the first byte moves: manifests and the set of files.

A `Manifest` is one file's whole sha256 and one sha256 per chunk; a `FileSet` numbers the chunks
of several files as one stream. Rank 0 builds them; every rank checks against them. The
transfer agent (sparkring_fanout.py) and the store (sparkring_fanout_store.py) build on this.

Standard library only: ships to the nodes with the fan-out modules, and is imported by the
agent when it runs as a script.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from dataclasses import asdict, dataclass

DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024


class FanoutError(Exception):
    """A transfer that must stop; the message names the rank, edge or file and the fix."""


@dataclass(frozen=True)
class Manifest:
    """One file every rank must end up with, known before the first byte moves."""

    name: str
    sha256: str
    size: int
    chunk_size: int
    chunks: tuple[str, ...]
    image_ref: str = ""
    image_id: str = ""
    image_bytes: int = 0

    def __post_init__(self) -> None:
        expected = max(1, -(-self.size // self.chunk_size))
        if self.chunk_size <= 0 or len(self.chunks) != expected:
            raise FanoutError(
                f"manifest {self.name}: {len(self.chunks)} chunk hashes for {self.size} bytes in "
                f"chunks of {self.chunk_size} (expected {expected}); hash the file again on rank 0"
            )
        check_relative_name(self.name)

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise FanoutError(f"manifest has unknown keys {sorted(unknown)}")
        return cls(**{**data, "chunks": tuple(data["chunks"])})

    def to_dict(self) -> dict:
        return {**asdict(self), "chunks": list(self.chunks)}

    def chunk_range(self, index: int) -> tuple[int, int]:
        start = index * self.chunk_size
        return start, min(self.chunk_size, self.size - start)


def check_relative_name(name: str) -> None:
    """A file's name inside the destination: relative, no '..', nothing a shell or a peer could bend."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in name:
        raise FanoutError(f"file name {name!r} must be a relative path without '.', '..' or empty parts")


def manifest_digest(entries: list[tuple[str, int, str]]) -> str:
    """The identity of a set of files: sha256 over sorted `name NUL size NUL sha256 LF` lines.

    The one definition: the model stage records it, the launch attests it, the fan-out's hello
    carries it, so two ranks with different bytes under the same names never agree."""
    digest = hashlib.sha256()
    for name, size, sha256 in sorted(entries):
        digest.update(f"{name}\0{size}\0{sha256}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class FileSet:
    """Files sent as one stream of chunks: file i's chunks are numbered after file i-1's."""

    files: tuple[Manifest, ...]

    def __post_init__(self) -> None:
        names = [manifest.name for manifest in self.files]
        if not names:
            raise FanoutError("a fan-out needs at least one file")
        if len(set(names)) != len(names):
            raise FanoutError(f"file names appear twice in one fan-out: {sorted(names)}")
        starts, total = [], 0
        for manifest in self.files:
            starts.append(total)
            total += len(manifest.chunks)
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "count", total)

    @classmethod
    def from_list(cls, data: list[dict]) -> FileSet:
        return cls(tuple(Manifest.from_dict(item) for item in data))

    def to_list(self) -> list[dict]:
        return [manifest.to_dict() for manifest in self.files]

    @property
    def digest(self) -> str:
        return manifest_digest([(m.name, m.size, m.sha256) for m in self.files])

    @property
    def size(self) -> int:
        return sum(manifest.size for manifest in self.files)

    @property
    def label(self) -> str:
        return self.files[0].name if len(self.files) == 1 else f"{len(self.files)} files"

    def locate(self, index: int) -> tuple[int, int]:
        """Global chunk index -> (file position, chunk index inside that file)."""
        if not 0 <= index < self.count:
            raise FanoutError(f"chunk index {index} outside 0..{self.count - 1}")
        position = bisect.bisect_right(self._starts, index) - 1
        return position, index - self._starts[position]

    def chunk_indices(self, position: int) -> range:
        start = self._starts[position]
        return range(start, start + len(self.files[position].chunks))


class ManifestBuilder:
    """Hash a file as it streams by: the whole sha256 and one per chunk, in one pass."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        self.chunk_size = chunk_size
        self.whole = hashlib.sha256()
        self.current = hashlib.sha256()
        self.filled = 0
        self.size = 0
        self.chunks: list[str] = []

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        self.whole.update(view)
        self.size += len(view)
        while view:
            take = min(len(view), self.chunk_size - self.filled)
            self.current.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == self.chunk_size:
                self.chunks.append(self.current.hexdigest())
                self.current, self.filled = hashlib.sha256(), 0

    def finish(self, name: str, **image: object) -> Manifest:
        chunks = list(self.chunks)
        if self.filled or not chunks:
            chunks.append(self.current.hexdigest())
        return Manifest(
            name=name,
            sha256=self.whole.hexdigest(),
            size=self.size,
            chunk_size=self.chunk_size,
            chunks=tuple(chunks),
            **image,  # type: ignore[arg-type]
        )


def build_manifest(
    path: str, chunk_size: int = DEFAULT_CHUNK_SIZE, name: str | None = None, **image: object
) -> Manifest:
    """Hash a finished file once: the whole sha256 and every chunk's (named `name` or its basename)."""
    builder = ManifestBuilder(chunk_size)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            builder.update(block)
    return builder.finish(name or os.path.basename(path), **image)


@dataclass(frozen=True)
class Route:
    """One direction of one link: the chunks with ``index % modulus == residue`` go over it."""

    peer_rank: int
    modulus: int = 1
    residue: int = 0

    def indices(self, count: int) -> list[int]:
        return [i for i in range(count) if i % self.modulus == self.residue]
