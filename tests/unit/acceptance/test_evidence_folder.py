"""An acceptance run's evidence folder is always a new one (library/sparkring_evidence_folder.py,
claimed by roles/acceptance/tasks/plan.yml): a folder that exists, with a stale gate JSON and a
foreign file in it, is passed over untouched, and nothing of it lands in the new run's folder."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module

SUBDIRS = ["attestations", "flight", "metrics", "sparkcache"]
STAMP = "acceptance-20261206T194512Z"


def evidence_module() -> ModuleType:
    return load_library_module("sparkring_evidence_folder")


def claim(capsys: pytest.CaptureFixture[str], root: Path, name: str = STAMP, **extra: object) -> dict:
    args = {"root": str(root), "name": name, "subdirs": SUBDIRS, **extra}
    with patch_module_args(args), pytest.raises(SystemExit):
        evidence_module().main()
    return json.loads(capsys.readouterr().out)


def tree(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def test_a_new_folder_is_claimed_with_its_subfolders_only(tmp_path, capsys) -> None:
    result = claim(capsys, tmp_path / "artifacts" / "sim")
    folder = tmp_path / "artifacts" / "sim" / STAMP
    assert result["changed"] and result["path"] == str(folder) and result["skipped"] == []
    assert sorted(p.name for p in folder.iterdir()) == SUBDIRS
    assert not [p for p in folder.rglob("*") if p.is_file()]


def test_an_existing_folder_with_foreign_files_is_never_reused_or_touched(tmp_path, capsys) -> None:
    """The issue's case: a run whose folder name exists, holding a stale AC-LOCK.json and a foreign
    file. The run gets <name>-2, empty; the old folder is byte for byte as it was."""
    old = tmp_path / STAMP
    (old / "attestations").mkdir(parents=True)
    (old / "AC-LOCK.json").write_text('{"id": "AC-LOCK", "status": "pass"}\n')
    (old / "notes-from-someone-else.txt").write_text("not evidence\n")
    (old / "attestations" / "rank0.json").write_text("{}\n")
    before = tree(old)
    result = claim(capsys, tmp_path)
    new = Path(result["path"])
    assert new == tmp_path / f"{STAMP}-2" and result["skipped"] == [str(old)]
    assert tree(old) == before
    assert not [p for p in new.rglob("*") if p.is_file()]  # nothing foreign, nothing stale
    assert sorted(p.name for p in new.iterdir()) == SUBDIRS


def test_runs_claiming_the_same_name_get_distinct_folders(tmp_path, capsys) -> None:
    """Two runs started in the same second (the stamp has seconds): the exclusive mkdir gives each
    its own folder."""
    paths = [claim(capsys, tmp_path)["path"] for _ in range(3)]
    assert paths == [str(tmp_path / STAMP), str(tmp_path / f"{STAMP}-2"), str(tmp_path / f"{STAMP}-3")]


def test_a_file_under_the_name_is_passed_over_too(tmp_path, capsys) -> None:
    (tmp_path / STAMP).write_text("a file, not a folder\n")
    result = claim(capsys, tmp_path)
    assert result["path"] == str(tmp_path / f"{STAMP}-2")
    assert (tmp_path / STAMP).read_text() == "a file, not a folder\n"


def test_check_mode_names_the_folder_and_creates_nothing(tmp_path, capsys) -> None:
    (tmp_path / "root" / STAMP).mkdir(parents=True)
    result = claim(capsys, tmp_path / "root", _ansible_check_mode=True)
    assert not result["changed"] and result["path"] == str(tmp_path / "root" / f"{STAMP}-2")
    assert [p.name for p in (tmp_path / "root").iterdir()] == [STAMP]
    result = claim(capsys, tmp_path / "absent", _ansible_check_mode=True)
    assert result["path"] == str(tmp_path / "absent" / STAMP) and not (tmp_path / "absent").exists()


def test_every_name_taken_fails_naming_the_folder_and_the_fix(tmp_path, capsys) -> None:
    for name in evidence_module().candidates(STAMP):
        (tmp_path / name).mkdir()
    result = claim(capsys, tmp_path)
    assert result["failed"]
    assert str(tmp_path / STAMP) in result["msg"] and "acceptance_evidence_root" in result["msg"]


@pytest.mark.parametrize("name", ["../escape", "a/b", ".."])
def test_a_name_that_is_not_a_plain_folder_name_is_refused(tmp_path, capsys, name) -> None:
    result = claim(capsys, tmp_path, name=name)
    assert result["failed"] and "name:" in result["msg"]
    assert not list(tmp_path.iterdir())
