"""A UTHelper-style harness for library/sparkring_cable.py (community.general's shape).

Each case in cable_cases.yml is data: the module input, flags (check mode), the node's
sysfs files, what the beacon exchange hears, the commands the module must run (in order)
with their output, and the expected result. The harness builds the sysfs tree, answers the
commands, runs main() exactly as Ansible does (patch_module_args) and returns the JSON
the module printed. A command the module runs that the case does not expect fails the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module


def _substitute(value: Any, tmp: Path) -> Any:
    """Cases name the test's private folder as @TMP@."""
    if isinstance(value, str):
        return value.replace("@TMP@", str(tmp))
    if isinstance(value, list):
        return [_substitute(item, tmp) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, tmp) for key, item in value.items()}
    return value


def _write_sysfs(root: Path, files: dict[str, Any]) -> None:
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{content}\n")


class CommandScript:
    """The commands a case expects, answered in order; effects (sysfs writes) land as each runs."""

    def __init__(self, expected: list[dict[str, Any]], sysfs: Path) -> None:
        self.expected = list(expected)
        self.sysfs = sysfs
        self.ran: list[list[str]] = []

    def __call__(self, _module: Any, args: list[str], **kwargs: Any) -> tuple[int, str, str]:
        argv = [str(arg) for arg in args]
        self.ran.append(argv)
        assert self.expected, f"unexpected command {argv}"
        step = self.expected.pop(0)
        assert argv == step["command"], f"expected {step['command']}, the module ran {argv}"
        if "stdin" in step:
            assert json.loads(kwargs.get("data") or "null") == step["stdin"], kwargs.get("data")
        _write_sysfs(self.sysfs, step.get("effects", {}).get("sysfs", {}))
        out = step.get("out", "")
        return step.get("rc", 0), out if isinstance(out, str) else json.dumps(out), step.get("err", "")


@pytest.fixture
def run_case(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Run one case; returns (exit code, result dict, commands left unrun)."""
    cable = load_library_module("sparkring_cable")
    link_facts = sys.modules["ansible.module_utils.sparkring_link_facts"]

    def _run(case: dict[str, Any]) -> tuple[int, dict[str, Any], list]:
        case = _substitute(case, tmp_path)
        sysfs = tmp_path / "sys"
        _write_sysfs(sysfs, case.get("sysfs", {}))
        (tmp_path / "python" / "transport").mkdir(parents=True, exist_ok=True)
        script = CommandScript(case.get("mocks", {}).get("run_command", []), sysfs)
        heard = case.get("beacon")
        beacons: list[tuple[str, dict]] = []

        def exchange(interface: str, identity: dict, _timeout: float, announce=None) -> Any:
            beacons.append((interface, identity))
            if heard is None:
                return link_facts.Beacon(None, False, "nothing heard within 10 s")
            return link_facts.Beacon(heard, True, None)

        monkeypatch.setattr(cable, "SYSFS", str(sysfs))
        monkeypatch.setattr(cable, "exchange_beacons", exchange)
        monkeypatch.setattr(
            cable.AnsibleModule, "run_command", lambda module, args, **kw: script(module, args, **kw)
        )
        monkeypatch.setattr(cable.AnsibleModule, "get_bin_path", lambda _m, name, **_k: f"/usr/sbin/{name}")
        args = dict(case["input"])
        if case.get("flags", {}).get("check"):
            args["_ansible_check_mode"] = True
        with patch_module_args(args), pytest.raises(SystemExit) as exited:
            cable.main()
        result = json.loads(capsys.readouterr().out)
        result["_beacons"] = beacons
        return exited.value.code, result, script.expected

    return _run


@pytest.fixture(scope="session")
def cable_module() -> ModuleType:
    """library/sparkring_cable.py, loaded as Ansible loads it (its judgements and CableQualifier)."""
    return load_library_module("sparkring_cable")
