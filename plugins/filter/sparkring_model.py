"""Controller-side filter: the models a cluster serves, pinned (profile + lock + inventory).

It only calls `sparkring.models.model_pins` (the one join), so the model stage and the preflight
check the same files against the same revision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from pydantic import ValidationError
from sparkring.lock import LOCK_PATH, load_lock
from sparkring.models import ModelPinError, model_pins
from sparkring.profile import ProfileError, load_profile_file


def sparkring_model_pins(
    profile_path: str, target: str, draft: str, sources: dict | None = None, lock_path: str = ""
) -> list[dict[str, Any]]:
    """`{{ profile | sparkring_model_pins(model_target, model_draft, model_sources, model_lock_file) }}`

    No sources (the launch, the preflight): only what every rank must hold. No lock path: the
    project's images/lock.json."""
    lock_file = Path(lock_path) if lock_path else LOCK_PATH
    try:
        profile = load_profile_file(profile_path)
        lock = load_lock(lock_file)
        return model_pins(
            profile,
            lock,
            target or "",
            draft or "",
            None if sources is None else {str(key): str(value) for key, value in sources.items()},
            profile_name=profile_path,
            lock_name=str(lock_file),
        )
    except (ProfileError, ModelPinError) as error:
        raise AnsibleFilterError(str(error)) from None
    except ValidationError as error:
        raise AnsibleFilterError(f"{lock_file}: {error}") from None
    except OSError as error:
        raise AnsibleFilterError(f"sparkring_model_pins: {error}") from None


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {"sparkring_model_pins": sparkring_model_pins}
