# Copyright: SparkRing contributors. Apache-2.0.
"""Where a fan-out's files are assembled on a rank: verified chunks, partial files, free space.

A file is written as `<name>.partial` and gets its final name only once its whole sha256
matches; a restarted transfer keeps every chunk that still verifies. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

try:  # inside an Ansible module
    from ansible.module_utils.sparkring_fanout_manifest import FanoutError, FileSet, Manifest, Route
    from ansible.module_utils.sparkring_integrity import sha256_file
except ImportError:  # run as a script: module_utils/ is the script's directory, hence on sys.path
    from sparkring_fanout_manifest import FanoutError, FileSet, Manifest, Route
    from sparkring_integrity import sha256_file


class FileStore:
    """The files being assembled in one directory: which chunks are verified, and waiters.

    A file the caller already holds (verified final file) is read from; any other is written
    as `<name>.partial` and gets its final name only once its whole sha256 matches."""

    def __init__(self, files: FileSet, dest: str, complete: frozenset[str] = frozenset()) -> None:
        self.files = files
        self.dest = dest
        self.count = files.count
        self.have: set[int] = set()
        self.failure: BaseException | None = None
        self.cond = threading.Condition()
        self.fds: list[int] = []
        self.partial: list[bool] = []
        self.resumed = 0  # chunks of interrupted transfers kept because they still verify
        try:
            for position, manifest in enumerate(files.files):
                final = os.path.join(dest, manifest.name)
                if manifest.name in complete:
                    self.fds.append(os.open(final, os.O_RDONLY))
                    self.partial.append(False)
                    self.have.update(files.chunk_indices(position))
                    continue
                os.makedirs(os.path.dirname(final), exist_ok=True)
                existed = os.path.exists(final + ".partial")
                self.fds.append(os.open(final + ".partial", os.O_RDWR | os.O_CREAT, 0o644))
                self.partial.append(True)
                if existed:
                    kept = self._scan(position)
                    self.have.update(kept)
                    self.resumed += len(kept)
                os.ftruncate(self.fds[-1], manifest.size)
        except BaseException:
            self.close()
            raise

    @property
    def complete(self) -> bool:
        return not any(self.partial)

    def _scan(self, position: int) -> set[int]:
        """Chunks of an interrupted transfer that still match the manifest."""
        manifest, fd = self.files.files[position], self.fds[position]
        length = os.fstat(fd).st_size
        good = set()
        for local, (index, digest) in enumerate(
            zip(self.files.chunk_indices(position), manifest.chunks, strict=True)
        ):
            start, size = manifest.chunk_range(local)
            if start + size > length:
                break
            if hashlib.sha256(os.pread(fd, size, start)).hexdigest() == digest:
                good.add(index)
        return good

    def missing(self, route: Route) -> list[int]:
        with self.cond:
            return [i for i in route.indices(self.count) if i not in self.have]

    def put(self, index: int, data: bytes) -> bool:
        """Write a chunk only if it matches the manifest; False means ask for it again."""
        position, local = self.files.locate(index)
        manifest = self.files.files[position]
        start, size = manifest.chunk_range(local)
        if len(data) != size or hashlib.sha256(data).hexdigest() != manifest.chunks[local]:
            return False
        if not self.partial[position]:
            return True  # already held (a duplicate); nothing to write
        os.pwrite(self.fds[position], data, start)
        with self.cond:
            self.have.add(index)
            self.cond.notify_all()
        return True

    def read(self, index: int) -> bytes:
        position, local = self.files.locate(index)
        start, size = self.files.files[position].chunk_range(local)
        return os.pread(self.fds[position], size, start)

    def next_available(self, pending: set[int], timeout: float) -> int:
        """The lowest pending chunk already verified here, waiting for one to arrive."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if self.failure is not None:
                    raise FanoutError(f"stopped: {self.failure}")
                ready = pending & self.have
                if ready:
                    return min(ready)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FanoutError(f"no new chunk for {timeout:.0f}s while relaying")
                self.cond.wait(left)

    def abort(self, error: BaseException) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = error
            self.cond.notify_all()

    def finalize(self) -> None:
        """Verify every assembled file whole, then give it its final name (never before)."""
        if len(self.have) != self.count:
            raise FanoutError(f"{self.dest}: {self.count - len(self.have)} chunks still missing")
        folders = set()
        for position, manifest in enumerate(self.files.files):
            if not self.partial[position]:
                continue
            partial = os.path.join(self.dest, manifest.name + ".partial")
            os.fsync(self.fds[position])
            actual = sha256_file(partial)
            if actual != manifest.sha256:
                raise FanoutError(
                    f"{partial}: sha256 {actual} != manifest {manifest.sha256} although every chunk "
                    "matched; the manifest is inconsistent, hash the file again on rank 0"
                )
            os.rename(partial, partial.removesuffix(".partial"))
            folders.add(os.path.dirname(partial))
        for folder in sorted(folders):
            fsync_dir(folder)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def fsync_dir(path: str) -> None:
    """Make a rename in `path` durable."""
    dir_fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def final_state(final_path: str, manifest: Manifest) -> str:
    """'absent', 'verified', or 'different' (a file with that name that is not this file)."""
    if not os.path.lexists(final_path):
        return "absent"
    if not os.path.isfile(final_path) or os.path.islink(final_path):
        return "different"
    if os.path.getsize(final_path) != manifest.size:
        return "different"
    return "verified" if sha256_file(final_path) == manifest.sha256 else "different"


def bytes_needed(dest: str, files: FileSet, complete: frozenset[str] = frozenset()) -> int:
    """Disk bytes a transfer still has to allocate (a resumed .partial already holds its size)."""
    needed = 0
    for manifest in files.files:
        if manifest.name in complete:
            continue
        partial = os.path.join(dest, manifest.name + ".partial")
        held = os.stat(partial).st_blocks * 512 if os.path.exists(partial) else 0
        needed += max(0, manifest.size - held)
    return needed


def free_bytes(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def check_space(
    dest: str, files: FileSet, reserve_bytes: int, rank: int, complete: frozenset[str] = frozenset()
) -> int:
    """Refuse before any byte moves when the files would not fit and leave the reserve free."""
    needed = bytes_needed(dest, files, complete)
    free = free_bytes(dest)
    if free - needed < reserve_bytes:
        raise FanoutError(
            f"rank {rank}: {dest} has {free} bytes free; the transfer needs {needed} more and "
            f"{reserve_bytes} must stay free; free space there or lower reserve_bytes"
        )
    return free
