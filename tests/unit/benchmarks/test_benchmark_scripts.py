"""Every benchmark script starts as its docstring says (`python -m benchmarks.<x>.<y> ...` from the
repository root): with no PYTHONPATH and no sys.path edit, its imports resolve (`benchmarks.*` and
`tests.*` from the root, the packages from the install), so `--help` answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# A script parses a command line and runs as __main__; a subcommand's module (bench.py's) does not.
SCRIPTS = sorted(
    p
    for p in ROOT.glob("benchmarks/*/*.py")
    if "argparse" in (text := p.read_text()) and '__name__ == "__main__"' in text
)


def module_of(script: Path) -> str:
    return ".".join(script.relative_to(ROOT).with_suffix("").parts)


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT / "benchmarks")) for p in SCRIPTS])
def test_the_script_starts_as_a_module_without_a_pythonpath(script: Path) -> None:
    assert f"-m {module_of(script)}" in script.read_text(), (
        f"{script}'s docstring: show its `python -m` command"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", module_of(script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
