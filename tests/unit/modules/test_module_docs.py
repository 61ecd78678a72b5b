"""Every module documents itself as ansible-doc reads it, and the documentation is its argument_spec.

ansible-doc renders DOCUMENTATION (with its fragments), EXAMPLES and RETURN of every module in
library/ and roles/*/library/; each rendered option tree must equal the argument_spec the
module hands AnsibleModule (names, types, required, defaults, choices, elements, aliases and
nested suboptions), so a user reading `ansible-doc` reads what the module enforces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.doc_fragments.action_common_attributes import (
    ModuleDocFragment as ActionCommonAttributes,
)

from tests.project_code import LIBRARY_DIRS, ROOT, load_library_module, load_project_file

ANSIBLE_DOC = Path(sys.executable).with_name("ansible-doc")
MODULES = {path.stem: path for folder in LIBRARY_DIRS for path in sorted(folder.glob("*.py"))}
# What AnsibleModule assumes when an argument_spec entry leaves a key out.
SPEC_DEFAULTS = {"type": "str", "required": False, "default": None, "choices": None, "elements": None}
COMPARED = (*SPEC_DEFAULTS, "aliases")
SUPPORT_LEVELS = {"full", "partial", "none", "N/A"}


class _SpecCaptured(Exception):
    """Raised by the stand-in AnsibleModule: main() got as far as declaring its arguments."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("argument_spec captured")
        self.kwargs = kwargs


class _CapturingModule:
    def __init__(self, **kwargs: Any) -> None:
        raise _SpecCaptured(kwargs)


def argument_spec(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The argument_spec the module's main() passes to AnsibleModule (nothing else of main runs);
    for an action plugin documented in library/ (a file without code), the plugin's ARGUMENT_SPEC."""
    action = ROOT / "plugins" / "action" / f"{name}.py"
    if action.exists():
        return load_project_file(action).ARGUMENT_SPEC
    module = load_library_module(name)
    monkeypatch.setattr(module, "AnsibleModule", _CapturingModule)  # the module other tests run, restored
    with pytest.raises(_SpecCaptured) as captured:
        module.main()
    return captured.value.kwargs["argument_spec"]


def option_drift(documented: dict[str, Any], spec: dict[str, Any], where: str = "") -> list[str]:
    """Every difference between a rendered option tree and an argument_spec, path first."""
    problems = [
        f"{where}{name}: in argument_spec, not documented" for name in spec.keys() - documented.keys()
    ]
    problems += [
        f"{where}{name}: documented, not in argument_spec" for name in documented.keys() - spec.keys()
    ]
    for name in sorted(documented.keys() & spec.keys()):
        doc, arg, path = documented[name], spec[name], f"{where}{name}"
        if not doc.get("description"):
            problems.append(f"{path}: no description")
        if "options" in doc:
            problems.append(f"{path}: nested options go under suboptions:, not options:")
        for key in COMPARED:
            want = arg.get(key, SPEC_DEFAULTS.get(key))
            have = doc.get(key, SPEC_DEFAULTS.get(key))
            if want != have:
                problems.append(f"{path}: {key} is {have!r} in DOCUMENTATION, {want!r} in argument_spec")
        problems += option_drift(doc.get("suboptions", {}), arg.get("options") or {}, f"{path}.")
    return problems


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    """Every module as `ansible-doc --json` renders it (one call for all of them)."""
    search = [arg for folder in LIBRARY_DIRS for arg in ("-M", str(folder))]
    done = subprocess.run(
        [str(ANSIBLE_DOC), *search, "-t", "module", "--json", *MODULES],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr and "ERROR" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def test_every_module_is_covered() -> None:
    assert len(MODULES) >= 8, sorted(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_documentation_is_the_argument_spec(
    rendered: dict[str, Any], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert name in rendered, f"ansible-doc did not render {name}"
    doc = rendered[name]["doc"]
    assert doc["short_description"] and doc["description"]
    drift = option_drift(doc.get("options") or {}, argument_spec(name, monkeypatch))
    assert not drift, f"{name}:\n" + "\n".join(drift)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_attributes_come_from_the_common_fragment(rendered: dict[str, Any], name: str) -> None:
    """Ansible's fragment describes check_mode, diff_mode and platform; the module states support and details."""
    common = yaml.safe_load(ActionCommonAttributes.DOCUMENTATION)["attributes"]
    attributes = rendered[name]["doc"]["attributes"]
    for key, attribute in common.items():
        assert attributes[key].get("description") == attribute["description"], (
            f"{name}: attributes.{key}: extend action_common_attributes and put the module's words in details"
        )
    for key, attribute in attributes.items():
        assert attribute.get("support") in SUPPORT_LEVELS, f"{name}: attributes.{key}.support"
        if attribute["support"] == "partial":
            assert attribute.get("details"), f"{name}: attributes.{key} is partial: say what in details"
    assert attributes["platform"].get("platforms"), f"{name}: attributes.platform.platforms"
    assert attributes["check_mode"]["support"] == "full", (
        f"{name}: every SparkRing module plans in check mode"
    )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_examples_and_return_render(rendered: dict[str, Any], name: str) -> None:
    examples = yaml.safe_load(rendered[name]["examples"])
    assert isinstance(examples, list) and examples, f"{name}: EXAMPLES is not a list of tasks"
    for task in examples:
        assert any(key in (name, f"sparkring.{name}") for key in task), f"{name}: example {task.get('name')}"
    returned = rendered[name]["return"]
    assert returned and all(value.get("description") for value in returned.values()), name


def test_option_drift_names_what_differs() -> None:
    """The comparison itself: every kind of difference is reported with its option path."""
    documented = {
        "a": {"description": "x", "type": "int", "default": 1},
        "b": {"description": "x", "type": "dict", "options": {}},
        "c": {
            "description": "",
            "type": "list",
            "elements": "dict",
            "suboptions": {"d": {"description": "x"}},
        },
        "gone": {"description": "x"},
    }
    spec = {
        "a": {"type": "int", "default": 2, "choices": [1, 2]},
        "b": {"type": "dict"},
        "c": {"type": "list", "elements": "dict", "options": {"d": {"required": True}, "e": {}}},
        "new": {"type": "bool"},
    }
    assert sorted(option_drift(documented, spec)) == sorted(
        [
            "a: choices is None in DOCUMENTATION, [1, 2] in argument_spec",
            "a: default is 1 in DOCUMENTATION, 2 in argument_spec",
            "b: nested options go under suboptions:, not options:",
            "c: no description",
            "c.d: required is False in DOCUMENTATION, True in argument_spec",
            "c.e: in argument_spec, not documented",
            "gone: documented, not in argument_spec",
            "new: in argument_spec, not documented",
        ]
    )
