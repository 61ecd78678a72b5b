"""One import root: pyproject.toml installs every package, and project code never edits sys.path."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Where sys.path edits are allowed: tests' own fixtures. Benchmarks run as modules from the
# repository root (`python -m benchmarks.x.y`), so `benchmarks.*` and test harnesses (`tests.*`) resolve.
ALLOWED = ("tests/",)
SYS_PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\[[^\]]*\]\s*=|sys\.path\s*[+]?=")


def test_the_install_provides_every_package() -> None:
    """`make venv` (pip install -e .) makes all four importable with no PYTHONPATH and no cwd help."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", "import sparkring.cluster, transport, overlay, sparkcache"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, f"run `make venv` (pip install -e .): {done.stderr[-800:]}"


def test_project_code_never_edits_sys_path() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    offenders = [
        name
        for name in listed
        if not name.startswith(ALLOWED)
        and (ROOT / name).is_file()
        and SYS_PATH_EDIT.search((ROOT / name).read_text(errors="replace"))
    ]
    assert not offenders, f"import through the installed packages (pyproject.toml) instead: {offenders}"
