"""Read-ahead for a restore: the kernel's own sequential read path, started early.

Each segment of a restore starts cold: the first read waits for the disk, and the kernel's
read-ahead then grows from a small window, so the hashing threads stall at every new file
(measured here: several 5-10 ms stalls in the first MiBs of each 32 MiB segment). One thread
walks the restore's byte ranges in order and pulls them into the page cache with sendfile()
to /dev/null (the ordinary read path, without a copy to user space), at most `ahead` bytes
past what the consumer has taken. It is only a hint: a failure stops it, the readers read
and verify every byte themselves either way.
"""

import contextlib
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK_BYTES = 2 << 20


class Prefetcher:
    """Streams `extents` (file, offset, length), in order, into the page cache."""

    def __init__(self, extents: list[tuple[Path, int, int]], ahead: int) -> None:
        self._extents = extents
        self._ahead = ahead
        self._fetched = 0  # bytes of the extents already in flight or cached
        self._consumed = 0  # bytes the consumer has taken
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sparkcache-prefetch", daemon=True)

    def __enter__(self) -> "Prefetcher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()

    def consumed(self, nbytes: int) -> None:
        with self._cond:
            self._consumed += nbytes
            self._cond.notify()

    def _wait_for_room(self) -> bool:
        with self._cond:
            while not self._stopped and self._fetched - self._consumed > self._ahead:
                self._cond.wait()
            return not self._stopped

    def _run(self) -> None:
        try:
            with open(os.devnull, "wb", buffering=0) as sink:
                for path, offset, length in self._extents:
                    if not self._stream(sink.fileno(), path, offset, offset + length):
                        return
        except OSError as exc:
            log.debug("SparkCache: prefetch stopped (%s); readers go on", exc)

    def _stream(self, sink: int, path: Path, offset: int, end: int) -> bool:
        fd = os.open(path, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, offset, end - offset, os.POSIX_FADV_SEQUENTIAL)
            while offset < end:
                if not self._wait_for_room():
                    return False
                sent = os.sendfile(sink, fd, offset, min(CHUNK_BYTES, end - offset))
                if sent == 0:
                    return True  # the file is shorter: the reader will say so
                offset += sent
                with self._cond:
                    self._fetched += sent
            return True
        finally:
            os.close(fd)


def extents_of(records: list[tuple[Path, int, int] | None]) -> list[tuple[Path, int, int]]:
    """(file, offset, length) of each record, neighbours in one file merged into one range."""
    merged: list[tuple[Path, int, int]] = []
    for rec in records:
        if rec is None:
            continue
        path, offset, length = rec
        if merged and merged[-1][0] == path and merged[-1][1] + merged[-1][2] == offset:
            merged[-1] = (path, merged[-1][1], merged[-1][2] + length)
        else:
            merged.append(rec)
    return merged
