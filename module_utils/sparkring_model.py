# Copyright: SparkRing contributors. Apache-2.0.
"""A model directory as the model stage keeps it on every rank (docs/design.md §3.3; stdlib only).

For a model at PATH (the launch profile's MODEL_PATH or DRAFT_PATH):

    PATH/                                exactly the pinned files; the launch mounts it read-only
    dirname(PATH)/.sparkring-models/
        <basename>.json                  the record: manifest digest, each file's sha256, chunk
                                         sha256s, and the stat stamp it had once verified
        <basename>.staging/              files being obtained or received (never mounted)
        <basename>.download/             the hub client's files and resume state (rank 0)
        <basename>.progress.json         what the transfer is doing now

PATH changes only by an atomic exchange with a complete, verified staging directory, so the
launch sees the old files or the new ones, never a mix or half a file. The record's stamps
(inode, size, mtime, ctime) let a later run, the preflight and the launch trust a file without
reading 382 GiB again: any write to a file, even one that puts its mtime back, moves its ctime.
This file is shared by the model module (which writes records), the preflight module and the
launch module (which only read them).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from dataclasses import dataclass

from ansible.module_utils.sparkring_fanout import manifest_digest
from ansible.module_utils.sparkring_integrity import write_json_atomic

RECORD_SCHEMA = 1
STORE = ".sparkring-models"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class Layout:
    """Where one model's files, record, staging directory and progress live on a rank."""

    path: str
    store: str
    record: str
    staging: str
    download: str
    progress: str


def layout(path: str) -> Layout:
    path = os.path.normpath(path)
    store = os.path.join(os.path.dirname(path), STORE)
    base = os.path.basename(path)
    return Layout(
        path=path,
        store=store,
        record=os.path.join(store, f"{base}.json"),
        staging=os.path.join(store, f"{base}.staging"),
        download=os.path.join(store, f"{base}.download"),
        progress=os.path.join(store, f"{base}.progress.json"),
    )


def pinned_digest(files: list[dict]) -> str:
    """The manifest digest of the lock's file list (path, size, sha256)."""
    return manifest_digest([(f["path"], int(f["size"]), f["sha256"]) for f in files])


def stamp(path: str) -> list[int]:
    """What a verified file looked like: inode, size, mtime and ctime in nanoseconds."""
    st = os.stat(path, follow_symlinks=False)
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def tree_files(top: str) -> tuple[list[str], list[str]]:
    """Relative paths under `top`: regular files, and anything else (links, sockets, ...)."""
    regular, other = [], []
    for folder, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, top)
            if os.path.isfile(full) and not os.path.islink(full):
                regular.append(relative)
            else:
                other.append(relative)
    return regular, other


def layout_problems(path: str, files: list[dict]) -> list[str]:
    """Every way PATH differs from the pinned layout (names and sizes; contents are the record's job)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return [f"{path} is not a directory"]
    regular, other = tree_files(path)
    pinned = {f["path"]: int(f["size"]) for f in files}
    problems = [f"{name}: missing" for name in sorted(set(pinned) - set(regular))]
    for name in sorted(set(pinned) & set(regular)):
        size = os.path.getsize(os.path.join(path, name))
        if size != pinned[name]:
            problems.append(f"{name}: {size} bytes, pinned {pinned[name]}")
    problems += [f"{name}: not in the manifest" for name in sorted(set(regular) - set(pinned))]
    problems += [f"{name}: not a regular file" for name in other]
    return problems


def read_record(where: Layout) -> dict | None:
    try:
        with open(where.record, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == RECORD_SCHEMA else None


def record_problems(where: Layout, files: list[dict]) -> tuple[str | None, list[str]]:
    """The digest the model stage verified, if the record still describes exactly these files.

    Cheap (stat only): every pinned file must be the very file the stage verified (same stamp).
    Returns (digest or None, problems naming each file that changed since)."""
    record = read_record(where)
    if record is None:
        return None, [f"no verified manifest at {where.record}"]
    digest = pinned_digest(files)
    if record.get("manifest_sha256") != digest:
        return None, [
            f"{where.record} records manifest {record.get('manifest_sha256')}, the lock pins {digest} "
            f"(revision {record.get('revision')} was verified here)"
        ]
    recorded = {entry["path"]: entry for entry in record.get("files", [])}
    problems = []
    for pinned in files:
        entry = recorded.get(pinned["path"])
        full = os.path.join(where.path, pinned["path"])
        if entry is None or entry.get("sha256") != pinned["sha256"]:
            problems.append(f"{pinned['path']}: not in the record")
            continue
        try:
            now = stamp(full)
        except OSError:
            problems.append(f"{pinned['path']}: missing")
            continue
        if now != entry.get("stamp"):
            problems.append(f"{pinned['path']}: changed since it was verified (size, mtime or ctime)")
    problems += layout_problems(where.path, files) if not problems else []
    return (digest if not problems else None), problems


def write_record(where: Layout, meta: dict, manifests: list[dict]) -> dict:
    """Stamp every file as it is now at PATH and write the record atomically."""
    entries = [
        {
            "path": m["name"],
            "size": m["size"],
            "sha256": m["sha256"],
            "chunk_size": m["chunk_size"],
            "chunks": m["chunks"],
            "stamp": stamp(os.path.join(where.path, m["name"])),
        }
        for m in sorted(manifests, key=lambda m: m["name"])
    ]
    record = {
        "schema": RECORD_SCHEMA,
        **meta,
        "manifest_sha256": manifest_digest([(e["path"], e["size"], e["sha256"]) for e in entries]),
        "files": entries,
    }
    os.makedirs(where.store, exist_ok=True)
    write_json_atomic(where.record, record)
    return record


def exchange(source: str, target: str) -> None:
    """Atomically swap two directories (renameat2 RENAME_EXCHANGE), or move source in place of
    an absent target. A filesystem without exchange (NFS) gets two renames: a moment without
    the target, never a mix of old and new files in it."""
    if not os.path.lexists(target):
        os.rename(source, target)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        done = renameat2(_AT_FDCWD, source.encode(), _AT_FDCWD, target.encode(), _RENAME_EXCHANGE)
        if done == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, f"renameat2({source}, {target}, RENAME_EXCHANGE): {os.strerror(code)}")
    aside = source + ".swap"
    os.rename(target, aside)
    os.rename(source, target)
    os.rename(aside, source)


def make_read_only(top: str) -> None:
    """Files 0444, folders 0555: what the launch mounts is not edited in place by accident."""
    for folder, dirs, names in os.walk(top):
        for name in names:
            os.chmod(os.path.join(folder, name), 0o444)
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o555)
    os.chmod(top, 0o555)


def remove_tree(path: str) -> None:
    """Remove a staging or replaced directory, read-only folders included."""
    if not os.path.lexists(path):
        return
    for folder, dirs, _names in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
    os.chmod(path, 0o755)
    shutil.rmtree(path)
