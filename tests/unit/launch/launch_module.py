"""library/sparkring_rank_launch loaded as Ansible runs it, and a rank's PATH of stand-in tools.

Tools a rank has and this machine has not (nvidia-smi, a rank's docker daemon) are small scripts
whose output is the real tool's format; the module's own code runs unchanged."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


def rank_launch() -> ModuleType:
    if "sparkring_rank_launch" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "sparkring_rank_launch", ROOT / "library" / "sparkring_rank_launch.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["sparkring_rank_launch"] = module
        spec.loader.exec_module(module)
    return sys.modules["sparkring_rank_launch"]


def tool(folder: Path, name: str, script: str) -> None:
    """An executable `folder/name` running `script` under /bin/sh."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_module(args: dict, capsys: pytest.CaptureFixture[str]) -> dict:
    """One module run; its JSON result."""
    with patch_module_args(args), pytest.raises(SystemExit):
        rank_launch().main()
    return json.loads(capsys.readouterr().out)
