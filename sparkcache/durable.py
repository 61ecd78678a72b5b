"""The few filesystem steps that make a publication survive a crash at any instant.

A file is visible under its final name only after its bytes are on disk (write, fsync,
link), and the directory entry itself is made durable (fsync of the directory).
"""

import contextlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, *parts: bytes | bytearray | memoryview) -> None:
    """Create `path` (it must not exist) holding `parts` in order, flushed to the device."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for part in parts:
            view = memoryview(part).cast("B")
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        unlink_quietly(path)  # a short write (disk full) must not linger
        raise
    finally:
        os.close(fd)


def publish_file(tmp: Path, final: Path, *, exist_ok: bool = True) -> None:
    """Give a synced temporary file its final name atomically, then make that durable.

    `link` (not rename) so an existing final name is never replaced behind a reader's
    back. exist_ok: the name says what the file holds (a manifest names its snapshot),
    so an existing one already holds it; otherwise FileExistsError.
    """
    try:
        os.link(tmp, final)
    except FileExistsError:
        if not exist_ok:
            raise
    finally:
        unlink_quietly(tmp)
    fsync_dir(final.parent)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
