"""The project's Ansible code as every test loads it: module_utils where Ansible finds it, files by path.

Ansible ships module_utils/ (and a role's module_utils/) to a node as `ansible.module_utils.<name>`;
tests/conftest.py calls `expose_module_utils()` once at session start, so a test imports
`ansible.module_utils.sparkring_*` as the modules do. Modules and plugins are files, not packages:
`load_project_file` imports one by its path from the project root (pyproject's pytest `pythonpath`
puts the root on sys.path), so every test in a process shares one copy and one set of classes.
Import it as `tests.project_code` (the root is on sys.path), so it works outside pytest too. Lanes
without Ansible (tests/device) load module_utils with `sparkring.module_utils.load_module_utils`.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MODULE_UTILS_DIRS = (ROOT / "module_utils", *sorted(ROOT.glob("roles/*/module_utils")))
LIBRARY_DIRS = (ROOT / "library", *sorted(ROOT.glob("roles/*/library")))


def expose_module_utils() -> None:
    """Put every module_utils/ folder on `ansible.module_utils.__path__`, as Ansible does for a module."""
    import ansible.module_utils

    for folder in map(str, MODULE_UTILS_DIRS):
        if folder not in ansible.module_utils.__path__:
            ansible.module_utils.__path__.append(folder)


def load_project_file(path: Path | str) -> ModuleType:
    """Import a project file (`roles/qualify/filter_plugins/sparkring_qualify.py`) once per process.

    Its module name is its path from the root (`roles.qualify.filter_plugins.sparkring_qualify`), so
    a module of library/ never meets a module_utils file of the same name in sys.modules.
    """
    wanted = (ROOT / path).resolve()
    name = ".".join(wanted.relative_to(ROOT).with_suffix("").parts)
    module = importlib.import_module(name)
    if module.__file__ is None or Path(module.__file__).resolve() != wanted:
        raise ImportError(
            f"{name} was found at {module.__file__}, not {wanted}: run pytest from this checkout "
            "(pyproject.toml puts its root on sys.path)",
            name=name,
        )
    return module


def load_library_module(name: str) -> ModuleType:
    """The Ansible module `name` from library/ or roles/*/library/, loaded once per process."""
    found = [folder / f"{name}.py" for folder in LIBRARY_DIRS if (folder / f"{name}.py").is_file()]
    if len(found) != 1:
        where = ", ".join(str(path.relative_to(ROOT)) for path in found) or "nowhere"
        raise ModuleNotFoundError(
            f"module {name!r} must be in exactly one of library/, roles/*/library/; found {where}",
            name=name,
        )
    return load_project_file(found[0])


def run_json_play(play: str, inventory: Path, folder: Path, *args: str) -> tuple[int, list[dict]]:
    """`ansible-playbook` of the play text `play` (written into `folder`) against `inventory`, with the
    project's ansible.cfg and the JSON callback: (rc, the play's tasks as that callback reports them)."""
    path = folder / "play.yml"
    path.write_text(play, encoding="utf-8")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    result = subprocess.run(
        [str(playbook), "-i", str(inventory), str(path), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        (played,) = json.loads(result.stdout)["plays"]
    except (ValueError, KeyError) as error:
        raise AssertionError(f"no JSON play from ansible-playbook ({error}): {result.stderr}") from None
    return result.returncode, played["tasks"]
