"""Controller-side filter: a cluster's launch profile (launch.env), validated, as a dict.

Stages other than the launch read single settings from the profile (the build stage reads
NCCL_MODE), so they go through the same strict parser and geometry as the launch itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring.profile import ProfileError, load_profile_file


def sparkring_launch_profile(path: str) -> dict[str, Any]:
    """`{{ inventory_dir ~ '/launch.env' | sparkring_launch_profile }}` -> the validated profile."""
    if not Path(path).is_file():
        raise AnsibleFilterError(
            f"launch profile {path} does not exist: every cluster folder needs a launch.env"
        )
    try:
        profile = load_profile_file(path)
    except ProfileError as error:
        raise AnsibleFilterError(str(error)) from None
    return profile.model_dump(mode="json") | {"geometry": profile.geometry.__dict__}


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {"sparkring_launch_profile": sparkring_launch_profile}
