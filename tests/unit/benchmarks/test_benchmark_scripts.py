"""Every benchmark script starts as its docstring says (`python benchmarks/<x>/<y>.py ...`): with no
PYTHONPATH, its imports resolve (benchmarks/ is not an installed package), so `--help` answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(p for p in ROOT.glob("benchmarks/*/*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT / "benchmarks")) for p in SCRIPTS])
def test_the_script_starts_without_a_pythonpath(script: Path, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
