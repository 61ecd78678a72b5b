"""The repository's commit-msg hook: a subject over 72 characters is refused, the body is free."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HOOK = ROOT / ".githooks" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    message_file = tmp_path / "COMMIT_EDITMSG"
    message_file.write_text(message)
    return subprocess.run([str(HOOK), str(message_file)], capture_output=True, text=True, check=False)


def test_a_subject_of_72_characters_with_a_long_body_passes(tmp_path: Path) -> None:
    result = run_hook(tmp_path, "x" * 72 + "\n\n" + "a body line of any length " * 20 + "\n")
    assert result.returncode == 0, result.stderr


def test_a_subject_of_73_characters_is_refused_with_its_length(tmp_path: Path) -> None:
    result = run_hook(tmp_path, "y" * 73 + "\n")
    assert result.returncode == 1
    assert "73 characters" in result.stderr


def test_comment_lines_git_adds_are_not_the_subject(tmp_path: Path) -> None:
    result = run_hook(tmp_path, "# " + "z" * 100 + "\nShort subject\n")
    assert result.returncode == 0, result.stderr


def test_make_installs_the_hooks_directory() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "git config core.hooksPath .githooks" in makefile
    assert HOOK.stat().st_mode & 0o111, "the hook must be executable"
