"""library/sparkring_rank_launch loaded as Ansible runs it, and a rank's PATH of stand-in tools.

Tools a rank has and this machine has not (nvidia-smi, a rank's docker daemon) are small scripts
whose output is the real tool's format; the module's own code runs unchanged."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module


def tool(folder: Path, name: str, script: str) -> None:
    """An executable `folder/name` running `script` under /bin/sh."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_module(args: dict, capsys: pytest.CaptureFixture[str]) -> dict:
    """One module run; its JSON result."""
    with patch_module_args(args), pytest.raises(SystemExit):
        load_library_module("sparkring_rank_launch").main()
    return json.loads(capsys.readouterr().out)
