"""Every role states each default once: a default in meta/argument_specs.yml equals defaults/main.yml.

ansible-doc and the argument validation read the spec's `default`; the role itself runs with
defaults/main.yml. When the two drift, the documentation promises one value and the role uses another.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
ROLES = sorted(p.parents[1] for p in ROOT.glob("roles/*/meta/argument_specs.yml"))


def spec_defaults(role: Path) -> dict[str, object]:
    """Each option's `default` across the role's entry points (they share one options block)."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    found: dict[str, object] = {}
    for entry in specs.values():
        for name, option in (entry.get("options") or {}).items():
            if "default" in option:
                found[name] = option["default"]
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_spec_defaults_equal_the_role_defaults(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    stated = spec_defaults(role)
    missing = sorted(name for name in stated if name not in defaults)
    assert not missing, (
        f"{role.name}: argument_specs gives a default for {missing}, defaults/main.yml does not"
    )
    differ = {name: (value, defaults[name]) for name, value in stated.items() if defaults[name] != value}
    assert not differ, f"{role.name}: argument_specs default != defaults/main.yml (spec, defaults): {differ}"


def test_every_role_has_defaults_and_specs() -> None:
    assert ROLES, "no role with meta/argument_specs.yml found"
    for role in ROLES:
        assert (role / "defaults" / "main.yml").is_file(), f"{role.name} has no defaults/main.yml"
