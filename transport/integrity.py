"""Content and secrecy rules every SparkRing process applies the same way.

The sha256 of a file and of a tree of files, JSON written so that a reader never sees half
of it, and which names carry secrets (their values are never written down). Standard
library only, one definition for every place SparkRing runs: the controller and the node
packages import `transport.integrity`; `module_utils/sparkring_integrity.py` is a
byte-for-byte copy that travels to the nodes inside Ansible modules and, through
images/build_context.py, into the runtime images beside the entrypoint
(tests/unit/transport/test_integrity.py keeps the two equal).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable

REDACTED = "<redacted>"
# A name is secret when it holds one of these words, or when its last word is KEY
# (VLLM_API_KEY, apiKey, private_key; not private_key_file, which names a path).
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSW", "PASSPHRASE", "CREDENTIAL")
# What an installed package tree holds that is not its source.
BYTECODE_DIRS = ("__pycache__",)
BYTECODE_SUFFIXES = (".pyc",)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, read in blocks (multi-GB archives and libraries alike)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tree_sha256(top: str | os.PathLike[str], names: Iterable[str]) -> str:
    """sha256 over sorted `name NUL file-sha256 LF` lines, names relative to `top`.

    Names and contents only (no modes, no times), so the same tree hashes the same in a
    checkout, on a node and inside an image."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(f"{name}\0{sha256_file(os.path.join(top, name))}\n".encode())
    return digest.hexdigest()


def package_files(top: str | os.PathLike[str]) -> list[str]:
    """The files of an installed package tree, relative to `top`, bytecode caches left out."""
    names = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in BYTECODE_DIRS)
        names += [
            os.path.relpath(os.path.join(folder, name), top)
            for name in files
            if not name.endswith(BYTECODE_SUFFIXES)
        ]
    return sorted(names)


def write_json_atomic(
    path: str | os.PathLike[str], data: object, indent: int | None = 1, sort_keys: bool = True
) -> None:
    """Write beside the target, fsync, rename: a reader sees the old file or the new one."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=indent, sort_keys=sort_keys)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def is_secret_name(name: str) -> bool:
    """Whether a key or variable name carries a credential by convention."""
    upper = name.upper().replace("-", "_")
    return any(marker in upper for marker in SECRET_MARKERS) or upper.endswith("KEY")


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """The environment as it may be written down: secret-named values replaced."""
    return {key: (REDACTED if is_secret_name(key) else value) for key, value in sorted(env.items())}
