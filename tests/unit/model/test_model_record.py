"""The model directory's record, layout checks and atomic exchange (module_utils/sparkring_model.py),
which the preflight and the launch attestation read: real files, real renames."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from ansible.module_utils import sparkring_fanout as fanout
from ansible.module_utils import sparkring_model as model
from model_harness import CHUNK, pinned_files


@pytest.fixture
def verified(checkpoint: Path, tmp_path: Path) -> tuple[model.Layout, list[dict]]:
    """A model directory with its record, as the model stage leaves it."""
    where = model.layout(str(tmp_path / "models" / "tiny"))
    os.makedirs(os.path.dirname(where.path))
    os.rename(checkpoint, where.path)
    files = pinned_files(Path(where.path))
    manifests = [
        fanout.build_manifest(os.path.join(where.path, f["path"]), CHUNK, name=f["path"]).to_dict()
        for f in files
    ]
    model.write_record(where, {"name": "tiny", "revision": "tiny-v1"}, manifests)
    return where, files


def test_a_recorded_directory_verifies_by_stat_alone(verified):
    where, files = verified
    digest, problems = model.record_problems(where, files)
    assert problems == [] and digest == model.pinned_digest(files)


def test_a_flipped_byte_is_noticed_even_with_its_mtime_put_back(verified):
    where, files = verified
    shard = Path(where.path) / "weights" / "model-00002-of-00002.safetensors"
    before = shard.stat()
    with open(shard, "r+b") as handle:
        handle.seek(CHUNK + 1)
        byte = handle.read(1)
        handle.seek(CHUNK + 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    digest, problems = model.record_problems(where, files)
    assert digest is None
    assert problems == [
        "weights/model-00002-of-00002.safetensors: changed since it was verified (size, mtime or ctime)"
    ]


def test_a_record_of_another_revision_is_not_this_one(verified):
    where, files = verified
    other = [dict(files[0], sha256="0" * 64), *files[1:]]
    digest, problems = model.record_problems(where, other)
    assert digest is None and "the lock pins" in problems[0]


def test_layout_names_missing_resized_and_extra_files(verified):
    where, files = verified
    os.chmod(where.path, 0o755)
    os.unlink(os.path.join(where.path, "config.json"))
    Path(where.path, "README.md").write_text("extra\n")
    os.symlink("/etc/passwd", os.path.join(where.path, "link"))
    problems = model.layout_problems(
        where.path, [*files, {"path": "empty.txt", "size": 9, "sha256": "0" * 64}][1:]
    )
    assert "README.md: not in the manifest" in problems
    assert "link: not a regular file" in problems
    assert "empty.txt: 0 bytes, pinned 9" in problems
    assert model.record_problems(where, files)[1][0] == "config.json: missing"


def test_exchange_swaps_two_directories_at_once(tmp_path):
    old, new = tmp_path / "model", tmp_path / "staging"
    old.mkdir()
    new.mkdir()
    (old / "a").write_text("old")
    (new / "a").write_text("new")
    model.exchange(str(new), str(old))
    assert (old / "a").read_text() == "new" and (new / "a").read_text() == "old"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    model.exchange(str(fresh), str(tmp_path / "absent"))
    assert (tmp_path / "absent").is_dir() and not fresh.exists()


@pytest.mark.skipif(sys.platform != "linux", reason="renameat2 is Linux's")
def test_read_only_trees_are_removable(tmp_path):
    top = tmp_path / "t"
    (top / "d").mkdir(parents=True)
    (top / "d" / "f").write_text("x")
    model.make_read_only(str(top))
    assert (top / "d").stat().st_mode & 0o777 == 0o555
    model.remove_tree(str(top))
    assert not top.exists()
