"""benchmarks/provenance.py: the facts every results file carries, read from this checkout for real."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks.history import source_trees
from benchmarks.provenance import ROOT, RunProvenance, git_commit

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_capture_names_the_checked_out_commit_the_cores_and_the_command() -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    record = RunProvenance.capture(["benchmarks/x/run.py", "--out", "a b.json"]).finish()
    assert record["git_commit"] == head.stdout.strip()
    assert record["cpu_cores"] == os.cpu_count()
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    assert record["cpu_model"] and record["cpu_model"] == (names[0] if names else record["cpu_model"])
    assert record["command"].endswith("benchmarks/x/run.py --out 'a b.json'")  # quoted as a shell would need
    for key in ("started_utc", "finished_utc"):
        assert datetime.datetime.fromisoformat(record[key]).utcoffset() == datetime.timedelta(0)
    for key in ("load_avg_start", "load_avg_end"):
        assert set(record[key]) == {"1m", "5m", "15m"}
        assert all(value >= 0 for value in record[key].values())


@needs_git
def test_a_tracked_change_marks_the_tree_dirty(tmp_path: Path) -> None:
    def git(*argv: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *argv], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "bench.py").write_text("one\n")
    git("add", "bench.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    (tmp_path / "untracked.json").write_text("{}\n")  # results being written do not make the tree dirty
    commit, dirty = git_commit(tmp_path)
    assert len(commit) == 40 and not dirty
    (tmp_path / "bench.py").write_text("two\n")
    assert git_commit(tmp_path) == (commit, True)


@needs_git
def test_a_tree_without_git_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"not a git checkout .*run benchmarks from a clone"):
        git_commit(tmp_path)


def test_a_copied_tree_names_its_commit_through_the_environment(tmp_path: Path, monkeypatch) -> None:
    """The device lane runs on a copy of the checkout (with a stale .git): the caller names the commit."""
    monkeypatch.setenv("SPARKRING_SOURCE_COMMIT", "a" * 40 + "+dirty")
    assert git_commit(tmp_path) == ("a" * 40, True)
    assert git_commit(ROOT) == ("a" * 40, True)  # it wins over a checkout's own .git
    monkeypatch.setenv("SPARKRING_SOURCE_COMMIT", "b" * 40)
    assert git_commit(tmp_path) == ("b" * 40, False)


@needs_git
def test_a_copied_tree_hashes_the_code_it_ran_from_its_files(tmp_path: Path, monkeypatch) -> None:
    """In the device lane's copy (a stale .git) the code a run measured is hashed from the files:
    the same hashes HEAD gives for the same files, other hashes once a file differs."""

    def git(*argv: str) -> str:
        done = subprocess.run(["git", "-C", str(tmp_path), *argv], check=True, capture_output=True, text=True)
        return done.stdout.strip()

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "a.py").write_text("one\n")
    (tmp_path / "tool.py").write_text("tool\n")
    git("init", "-q")
    git("add", "code", "tool.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    at_head = source_trees(["code", "tool.py"], tmp_path)
    assert at_head == {"code": git("rev-parse", "HEAD:code"), "tool.py": git("rev-parse", "HEAD:tool.py")}
    monkeypatch.setenv("SPARKRING_SOURCE_COMMIT", "c" * 40)
    assert source_trees(["code", "tool.py"], tmp_path) == at_head
    (tmp_path / "code" / "a.py").write_text("two\n")  # the copy carries other code than its .git's HEAD
    (tmp_path / "code" / "b.py").write_text("new\n")
    copied = source_trees(["code", "tool.py"], tmp_path)
    assert copied["code"] != at_head["code"] and copied["tool.py"] == at_head["tool.py"]
    status = subprocess.run(
        ["git", "-C", str(tmp_path), "status", "--porcelain"], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert sorted(status) == [" M code/a.py", "?? code/b.py"]  # the real index was left alone
    with pytest.raises(SystemExit, match="missing is not in this copy"):
        source_trees(["missing"], tmp_path)
