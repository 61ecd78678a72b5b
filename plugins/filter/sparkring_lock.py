"""Controller-side filter: images/lock.json with one runtime image's overlay pins put in.

The only way pins enter the lock (playbooks/overlay-pins.yml writes the result with
`ansible.builtin.copy`, so `--check --diff` shows the change first); the validation and the
refusal of pins measured in an image the lock no longer builds live in `sparkring.lock`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring.lock import with_overlay_pins


def sparkring_lock_with_overlay_pins(lock_text: str, flavor: str, pins: dict) -> str:
    """`{{ lookup('file', 'images/lock.json') | sparkring_lock_with_overlay_pins('sim', measured.pins) }}`"""
    if flavor not in ("gb10", "sim"):
        raise AnsibleFilterError(f"sparkring_lock_with_overlay_pins: flavor {flavor!r}, expected gb10 or sim")
    try:
        return with_overlay_pins(lock_text, flavor, dict(pins))  # type: ignore[arg-type]
    except ValueError as error:
        raise AnsibleFilterError(f"images/lock.json: {error}") from None


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {"sparkring_lock_with_overlay_pins": sparkring_lock_with_overlay_pins}
