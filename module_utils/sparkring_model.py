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
This file is shared by the model module (which assesses, stages, promotes and writes records),
the preflight module and the launch module (which only read them).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from dataclasses import dataclass

from ansible.module_utils.sparkring_fanout_manifest import manifest_digest
from ansible.module_utils.sparkring_fanout_store import fsync_dir
from ansible.module_utils.sparkring_integrity import sha256_file, write_json_atomic

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


def symlinks(where: Layout) -> list[tuple[str, str]]:
    """Every symlink the stage could write through, with where it points: PATH, the store, staging
    and download themselves, and anything below PATH, staging and download (none is followed).

    The stage writes, hard-links, chmods and replaces what it finds there, so a link (say
    `weights/ -> /elsewhere`) would let it change files outside the model directory."""
    found = []
    for top in (where.path, where.store, where.staging, where.download):
        if os.path.islink(top):
            found.append((top, os.readlink(top)))
    for top in (where.path, where.staging, where.download):
        if os.path.isdir(top) and not os.path.islink(top):
            found += symlinks_under(top)
    return found


def symlinks_under(top: str) -> list[tuple[str, str]]:
    """Every symlink below `top`, files and folders alike (none is followed), with where it points.

    The one test for both sides: the stage refuses links in a model directory and the pin refuses
    them in the directory it pins, so a pinned tree is regular files only."""
    found = []
    for folder, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names + dirs):
            full = os.path.join(folder, name)
            if os.path.islink(full):
                found.append((full, os.readlink(full)))
    return found


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


def assess(where: Layout, files: list[dict], verify: str) -> dict:
    """What this rank holds of the pinned files: each verified at PATH (by the record's stamp when
    `verify` is stat, else by hashing) or lacking; the entries not in the manifest; the record's state
    (current, stale, absent); the verified files' recorded chunks."""
    record = read_record(where)
    recorded = {}
    if record and record.get("manifest_sha256") == pinned_digest(files):
        recorded = {entry["path"]: entry for entry in record["files"]}
    verified, lacks, stamps_ok = [], [], bool(recorded)
    for pin in sorted(files, key=lambda f: f["path"]):
        full = os.path.join(where.path, pin["path"])
        if not os.path.isfile(full) or os.path.islink(full) or os.path.getsize(full) != pin["size"]:
            lacks.append(pin["path"])
            stamps_ok = False
            continue
        entry = recorded.get(pin["path"], {})
        same = entry.get("sha256") == pin["sha256"] and entry.get("stamp") == stamp(full)
        stamps_ok = stamps_ok and same
        if (same and verify == "stat") or sha256_file(full) == pin["sha256"]:
            verified.append(pin["path"])
        else:
            lacks.append(pin["path"])
    extras = []
    if os.path.isdir(where.path) and not os.path.islink(where.path):
        regular, other = tree_files(where.path)
        extras = sorted(set(regular) - {f["path"] for f in files}) + other
    elif os.path.lexists(where.path):
        extras = [f"{where.path} (not a directory)"]
    state = "current" if stamps_ok and not extras else ("stale" if record else "absent")
    return {
        "verified": verified,
        "lacks": lacks,
        "extras": extras,
        "record": state,
        "chunks": {name: recorded[name] for name in verified if recorded.get(name, {}).get("chunks")},
    }


def lacks_bytes(where: Layout, files: list[dict], lacks: list[str]) -> int:
    """Bytes still to move for these files: a resumable partial in staging counts what it holds."""
    sizes = {f["path"]: f["size"] for f in files}
    needed = 0
    for name in lacks:
        partial = os.path.join(where.staging, name + ".partial")
        held = os.stat(partial).st_blocks * 512 if os.path.exists(partial) else 0
        needed += max(0, sizes[name] - held)
    return needed


def prepare_staging(where: Layout, files: list[dict], verified: list[str]) -> frozenset[str]:
    """Verified files hard-linked in, stale leftovers out, damaged copies kept as resumable partials.

    Returns the names complete in staging."""
    staging = where.staging
    os.makedirs(staging, exist_ok=True)
    complete = set()
    for pin in sorted(files, key=lambda f: f["path"]):
        final = os.path.join(staging, pin["path"])
        partial = final + ".partial"
        current = os.path.join(where.path, pin["path"])
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if pin["path"] in verified:
            if os.path.lexists(final) and not os.path.samefile(final, current):
                os.unlink(final)
            if not os.path.lexists(final):
                os.link(current, final)
            complete.add(pin["path"])
            continue
        if os.path.lexists(final):  # renamed by an interrupted run: keep it only if it verifies
            if os.path.isfile(final) and sha256_file(final) == pin["sha256"]:
                complete.add(pin["path"])
                continue
            os.unlink(final)
        if not os.path.exists(partial) and os.path.isfile(current) and not os.path.islink(current):
            shutil.copyfile(current, partial)  # a damaged copy: its good chunks are kept
    names = {f["path"] for f in files}
    wanted = names | {name + ".partial" for name in names}
    regular, other = tree_files(staging)
    for name in [n for n in regular if n not in wanted] + other:
        path = os.path.join(staging, name)
        (remove_tree if os.path.isdir(path) and not os.path.islink(path) else os.unlink)(path)
    return frozenset(complete)


def promote(where: Layout) -> None:
    """Swap the complete staging directory in for PATH, atomically, then drop the old files."""
    make_read_only(where.staging)
    exchange(where.staging, where.path)
    fsync_dir(os.path.dirname(where.path))
    remove_tree(where.staging)


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
