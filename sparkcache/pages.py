"""The on-disk page: one chunk's KV for one rank shard, self-describing and checksummed.

    b"SPKCPG01" | u32 header length | header JSON | payload

The header names the identity, the chunk key and the layer layout; the sha256 of the whole
page is its record in the manifest that admitted it. Pages lie back to back in segment
files (see store.py); `read_page_at` reads one and checks that sha256 before parsing it.
"""

import hashlib
import json
import os
import struct
import sys
import threading
from dataclasses import dataclass

MAGIC = b"SPKCPG01"
_LEN = struct.Struct("<I")
READ_PIECE_BYTES = 256 << 10
"""Bytes read, then hashed, at a time: hashed while still in the CPU cache, which a whole
page of MiBs is not, and small enough for the kernel's read-ahead to stay ahead."""


class PageError(Exception):
    """A page that must not be served: wrong bytes, wrong identity or wrong key."""


@dataclass(frozen=True)
class LayerLayout:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Page:
    key: str
    identity: str
    layers: tuple[LayerLayout, ...]
    payload: Buffer  # a view into the read buffer on restore: pages are MiBs, copies cost


def encode_page(page: Page) -> tuple[bytes, Buffer]:
    """The page as (head, payload): written one after the other, never concatenated."""
    if sum(layer.nbytes for layer in page.layers) != memoryview(page.payload).nbytes:
        raise ValueError("page layer sizes do not add up to its payload")
    header = {
        "key": page.key,
        "identity": page.identity,
        "layers": [[layer.name, layer.dtype, list(layer.shape), layer.nbytes] for layer in page.layers],
    }
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + _LEN.pack(len(blob)) + blob, page.payload


def page_sha256(head: Buffer, payload: Buffer) -> str:
    digest = hashlib.sha256(head)
    digest.update(payload)
    return digest.hexdigest()


class PageBuffers:
    """Read buffers, taken again once nothing holds a view of them any more.

    A fresh buffer of MiBs costs a page fault per 4 KiB at first touch (measured here: reusing
    buffers made a restore about a fifth faster). Whether a buffer is still in use is its
    reference count: every view of it (memoryview slices, torch.frombuffer) holds one, so a
    buffer a consumer still holds is never handed out again; it is simply not reused.
    """

    def __init__(self, keep_bytes: int) -> None:
        self._keep_bytes = keep_bytes
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bytearray:
        with self._lock:
            idle = None
            for i in range(len(self._buffers)):
                if sys.getrefcount(self._buffers[i]) == 2:  # the list's and the argument's: no view
                    if len(self._buffers[i]) == nbytes:
                        return self._buffers[i]
                    idle = i
            fresh = bytearray(nbytes)
            if sum(map(len, self._buffers)) + nbytes <= self._keep_bytes:
                self._buffers.append(fresh)
            elif idle is not None:
                self._buffers[idle] = fresh  # pages changed size: keep the new size
            return fresh


def read_page_at(
    fd: int,
    offset: int,
    nbytes: int,
    *,
    key: str,
    identity: str,
    sha256: str,
    buffers: PageBuffers | None = None,
) -> Page:
    """The page stored at `offset` of the open file `fd`, verified; PageError rather than bad KV.

    Reads into the page's own buffer (from `buffers` when given), a piece at a time, hashing
    each piece right after it lands (pread and hashlib release the GIL: several pages go at
    once).
    """
    data = buffers.take(nbytes) if buffers is not None else bytearray(nbytes)
    view = memoryview(data)
    digest = hashlib.sha256()
    got = 0
    while got < nbytes:
        piece = view[got : got + READ_PIECE_BYTES]
        n = os.preadv(fd, [piece], offset + got)
        if n == 0:
            raise PageError(f"page {key[:16]}: the file ends before the size in its manifest record")
        digest.update(piece[:n])
        got += n
    if digest.hexdigest() != sha256:
        raise PageError(f"page {key[:16]}: sha256 differs from its manifest record")
    return _parse(view, key=key, identity=identity)


def _parse(data: memoryview, *, key: str, identity: str) -> Page:
    """The page in bytes whose sha256 already matched its record; checks what they claim to be."""
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise PageError(f"page {key[:16]}: not a SparkCache page")
    start = len(MAGIC) + _LEN.size
    (length,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(bytes(data[start : start + length]))
    except ValueError as exc:
        raise PageError(f"page {key[:16]}: unreadable header ({exc})") from exc
    payload = data[start + length :]
    if header.get("key") != key or header.get("identity") != identity:
        raise PageError(f"page {key[:16]}: written for another chunk or cache identity")
    layers = tuple(LayerLayout(n, d, tuple(s), b) for n, d, s, b in header["layers"])
    if sum(layer.nbytes for layer in layers) != payload.nbytes:
        raise PageError(f"page {key[:16]}: layer sizes do not match the payload")
    return Page(key=key, identity=identity, layers=layers, payload=payload)
