"""Locks for launch rendering tests: the committed lock, and the same lock with overlay pins for
the fork flavor's image (measured pins do not exist for it yet; these stand in for what the pin module
would write, so that rendering the example ring can go past the overlay's refusal)."""

from __future__ import annotations

from sparkring.lock import Lock, load_lock

from overlay.registry import PATCHES


def fork_pins(lock: Lock) -> dict:
    return {
        "image": lock.vllm_origin("fork"),
        "vllm_version": lock.vllm_version_in("fork"),
        "wrappers": "0.32.0",
        "files": {patch.file: "5e" * 32 for patch in PATCHES},
    }


def pinned_lock() -> Lock:
    """The committed lock plus overlay pins for the fork flavor."""
    lock = load_lock()
    data = lock.model_dump(mode="json")
    data["overlay_pins"] = {**data["overlay_pins"], "fork": fork_pins(lock)}
    return Lock.model_validate(data)
