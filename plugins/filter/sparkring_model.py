"""Controller-side filters: the models a cluster serves, pinned (profile + lock + inventory), and
images/lock.json with one model's pin put in.

They only call `sparkring.models.model_pins` (the one join), so the model stage and the preflight
check the same files against the same revision, and `sparkring.lock.with_model` (the one schema)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from pydantic import ValidationError
from sparkring.lock import LOCK_PATH, load_lock, with_model
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


def sparkring_lock_with_model(lock_text: str, name: str, model: dict) -> str:
    """`{{ lookup('file', 'images/lock.json', rstrip=false) | sparkring_lock_with_model('glm', measured.model) }}`"""
    try:
        # Ansible hands over lazy, tagged values: plain JSON types for the schema.
        return with_model(str(lock_text), str(name), json.loads(json.dumps(model, default=str)))
    except ValidationError as error:
        raise AnsibleFilterError(f"images/lock.json models.{name}: {error}") from None
    except ValueError as error:
        raise AnsibleFilterError(f"images/lock.json: {error}") from None


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "sparkring_model_pins": sparkring_model_pins,
            "sparkring_lock_with_model": sparkring_lock_with_model,
        }
