"""Controller-side filters: images/lock.json with one runtime image's overlay pins, or its wheel set, put in.

The only ways pins and wheel sets enter the lock (playbooks/overlay-pins.yml and
playbooks/wheel-lock.yml write the result with `ansible.builtin.copy`, so `--check --diff` shows
the change first); the validation, and the refusal of pins measured in an image the lock no
longer builds, live in `sparkring.lock`."""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring.lock import FLAVORS, with_overlay_pins, with_wheels


def _plain(value: Any) -> dict:
    """A module's result as plain JSON types (Ansible hands over lazy, tagged containers)."""
    return json.loads(json.dumps(value, default=str))


def _flavor(name: str, flavor: str) -> None:
    if flavor not in FLAVORS:
        raise AnsibleFilterError(f"{name}: flavor {flavor!r}, expected one of {', '.join(FLAVORS)}")


def sparkring_lock_with_overlay_pins(lock_text: str, flavor: str, pins: dict) -> str:
    """`{{ lookup('file', 'images/lock.json') | sparkring_lock_with_overlay_pins('sim', measured.pins) }}`"""
    _flavor("sparkring_lock_with_overlay_pins", flavor)
    try:
        return with_overlay_pins(lock_text, flavor, _plain(pins))  # type: ignore[arg-type]
    except ValueError as error:
        raise AnsibleFilterError(f"images/lock.json: {error}") from None


def sparkring_lock_with_wheels(lock_text: str, flavor: str, wheel_set: dict) -> str:
    """`{{ lookup('file', 'images/lock.json') | sparkring_lock_with_wheels('upstream', resolved.wheel_set) }}`"""
    _flavor("sparkring_lock_with_wheels", flavor)
    try:
        return with_wheels(lock_text, flavor, _plain(wheel_set))  # type: ignore[arg-type]
    except ValueError as error:
        raise AnsibleFilterError(f"images/lock.json: {error}") from None


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "sparkring_lock_with_overlay_pins": sparkring_lock_with_overlay_pins,
            "sparkring_lock_with_wheels": sparkring_lock_with_wheels,
        }
