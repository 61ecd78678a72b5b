"""The models a cluster serves, pinned (docs/design.md §3.2, §3.3): the one join of profile, lock and inventory.

The launch profile says where each model lives on the ranks and which revision it is
(MODEL_PATH/MODEL_REVISION, DRAFT_PATH/DRAFT_REVISION); the image lock pins what that revision
is, file by file; the inventory names which lock entry each path holds and where rank 0 finds
the files (a source directory) when they do not come from the hub. `model_pins` joins the
three and refuses any disagreement, naming both sides, before anything is read or moved.
"""

from __future__ import annotations

from typing import Any

from sparkring.lock import Lock
from sparkring.profile import LaunchProfile


class ModelPinError(ValueError):
    """The profile, the lock and the inventory disagree; each line names the key and the fix."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def model_pins(
    profile: LaunchProfile,
    lock: Lock,
    target: str,
    draft: str,
    sources: dict[str, str] | None = None,
    profile_name: str = "the launch profile",
    lock_name: str = "images/lock.json",
) -> list[dict[str, Any]]:
    """One entry per model the profile serves (the target, then the draft when it has one).

    `sources` (lock entry -> directory on rank 0) is the model stage's: with it, each pin also
    says where rank 0 obtains the files. The launch and the preflight pass none: they only
    check what the ranks hold."""
    wanted = [("target", target, profile.model_path, profile.model_revision, "MODEL")]
    if profile.draft_path or draft:
        wanted.append(("draft", draft, profile.draft_path, profile.draft_revision, "DRAFT"))
    errors, pins = [], []
    for role, name, path, revision, key in wanted:
        if not name:
            errors.append(
                f"model_{role}: empty, but {profile_name} sets {key}_PATH={path}: name the {lock_name} "
                "models entry that pins it (inventory group_vars)"
            )
            continue
        if name not in lock.models:
            errors.append(
                f"model_{role}: {name!r} is not among the {lock_name} models ({', '.join(sorted(lock.models))}); "
                "pin it there (repository, revision and every file)"
            )
            continue
        if not path:
            errors.append(
                f"{key}_PATH: not set in {profile_name}, but model_{role} names {lock_name} models.{name}"
            )
            continue
        pinned = lock.models[name]
        if pinned.role != role:
            errors.append(
                f"model_{role}: {lock_name} models.{name} is pinned as a {pinned.role}, not a {role}"
            )
        if revision != pinned.revision:
            errors.append(
                f"{key}_REVISION: {revision} in {profile_name}, but {lock_name} models.{name}.revision pins "
                f"{pinned.revision}; make them equal (pin the new revision's files in the lock, or serve "
                "the pinned one)"
            )
        source_dir = (sources or {}).get(name) or None
        if sources is not None and pinned.source == "generated" and not source_dir:
            errors.append(
                f"model_sources.{name}: {lock_name} models.{name} is generated here, so rank 0 needs a source "
                "directory holding it (e.g. make sim-model's output)"
            )
        pins.append(
            {
                "role": role,
                "name": name,
                "path": path,
                "revision": pinned.revision,
                "source": "dir" if source_dir else "hub",
                "source_dir": source_dir,
                "repository": pinned.repository,
                "files": [file.model_dump() for file in pinned.files],
                "bytes": sum(file.size for file in pinned.files),
            }
        )
    unknown = sorted(set(sources or {}) - set(lock.models))
    if unknown:
        errors.append(f"model_sources: {unknown} are not {lock_name} models entries")
    if len(pins) == 2 and _nested(pins[0]["path"], pins[1]["path"]):
        errors.append(
            f"DRAFT_PATH: {pins[1]['path']} and MODEL_PATH {pins[0]['path']} overlap; give each model its own directory"
        )
    if errors:
        raise ModelPinError(errors)
    return pins


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)
