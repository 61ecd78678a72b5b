# Copyright: SparkRing contributors. Apache-2.0.
"""What the lock accepts as a pinned model's names (stdlib only, no imports of the project).

One rule for the controller and the nodes: the lock's schema (plugins/sparkring/lock.py loads this
file) refuses what the pin command refuses before it hashes a byte, and the model stage writes
exactly the names the lock holds. A file's path is UTF-8 in Unicode NFC (the form the hub and
Linux tools produce; `tokenizer-é.json` is pinned as such), so the same name is the same bytes on
every rank; a name in another form (NFD, as copies from macOS carry) is refused, not rewritten,
because its bytes on disk would no longer be the pinned name.
"""

from __future__ import annotations

import re
import unicodedata

HUB_COMMIT = re.compile(r"[0-9a-f]{40}")
# Characters a path component may hold besides non-ASCII letters, marks and digits.
ASCII_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-")
NAME_FIX = (
    "rename it (letters, digits, '_', '.', '+', '-'; a non-ASCII name in Unicode NFC), or leave it out "
    "of the pin (exclude)"
)


def file_name_problem(path: str) -> str | None:
    """Why `path` cannot be a pinned file's path (relative, '/'-separated), or None."""
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"{path!r}: a model file path is relative and stays inside the model directory (no '', '.' or '..')"
    odd = sorted(
        {
            char
            for char in path
            if char != "/"
            and char not in ASCII_NAME
            and (char.isascii() or unicodedata.category(char)[0] not in "LMN")
        }
    )
    if odd:
        shown = ", ".join(repr(char) for char in odd)
        return f"{path!r}: holds {shown}; {NAME_FIX}"
    if unicodedata.normalize("NFC", path) != path:
        return f"{path!r}: not in Unicode NFC (it is written {path!a}); {NAME_FIX}"
    return None


def hub_commit_problem(revision: str) -> str | None:
    """Why `revision` cannot pin a hub model (a branch, a tag, a short or upper-case hash), or None."""
    if HUB_COMMIT.fullmatch(revision):
        return None
    return (
        f"revision {revision!r}: a hub model is pinned by its exact 40-hex commit (lower case), never a "
        "branch or tag; use the commit id (the hub's history of the repository, or "
        "huggingface_hub.HfApi().model_info(REPOSITORY, revision=BRANCH).sha)"
    )
