"""images/nccl/fetch_source.py: pinned bytes or nothing, fetched once into the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sparkring.module_utils import load_module_utils


def write_lock(path: Path, release: dict, version: str = "9.9.9-1") -> Path:
    path.write_text(json.dumps({"nccl": {"default_version": version, "releases": {version: release}}}))
    return path


def test_file_source_is_verified_then_reused_from_the_cache(fetcher, fixture_lib, tmp_path):
    fixture_lib.make_fixture(tmp_path / "fx")
    cache = tmp_path / "cache"
    first = fetcher.fetch(cache=cache, lock_path=tmp_path / "fx" / "lock.json")
    again = fetcher.fetch(cache=cache, lock_path=tmp_path / "fx" / "lock.json")
    assert first["fetched"] is True and again["fetched"] is False
    assert (
        fetcher.sha256_file(Path(first["path"])) == first["sha256"]
        and Path(first["path"]).parent == cache / "src"
    )


def test_bytes_that_are_not_the_pin_are_refused_and_not_cached(fetcher, fixture_lib, tmp_path):
    release = fixture_lib.make_fixture(tmp_path / "fx")["nccl"]["releases"][fixture_lib.VERSION]
    lock = write_lock(tmp_path / "lock.json", release | {"source_sha256": "0" * 64})
    with pytest.raises(fetcher.FetchError, match="refusing it"):
        fetcher.fetch(cache=tmp_path / "cache", lock_path=lock)
    assert not list((tmp_path / "cache" / "src").iterdir())


def test_a_tree_pinned_source_is_checked_by_its_unpacked_tree(fetcher, fixture_lib, tmp_path):
    """GitHub's archives of a commit: the bytes are GitHub's packing, the tree is the pin."""
    release = fixture_lib.make_fixture(tmp_path / "fx")["nccl"]["releases"][fixture_lib.VERSION]
    nccl = load_module_utils("sparkring_nccl")
    tree = nccl.extract_source(
        release["source_url"].removeprefix("file://"), release["source_dir"], tmp_path / "t"
    )
    pinned = release | {"source_sha256": None, "source_tree_sha256": nccl.source_tree_digest(tree)}
    got = fetcher.fetch(cache=tmp_path / "cache", lock_path=write_lock(tmp_path / "lock.json", pinned))
    assert got["fetched"] is True and Path(got["path"]).is_file()
    again = fetcher.fetch(cache=tmp_path / "cache", lock_path=tmp_path / "lock.json")
    assert again["fetched"] is False
    wrong = write_lock(tmp_path / "wrong.json", pinned | {"source_tree_sha256": "0" * 64})
    with pytest.raises(fetcher.FetchError, match="unpacked tree with digest"):
        fetcher.fetch(cache=tmp_path / "cache2", lock_path=wrong)
    assert not list((tmp_path / "cache2" / "src").iterdir())


def test_unpinned_release_is_refused_before_any_download(fetcher, tmp_path):
    release = {
        "source_url": "https://example.invalid/nccl.tar.gz",
        "source_sha256": None,
        "source_dir": "x",
        "patches": [],
    }
    with pytest.raises(fetcher.FetchError, match="is not pinned"):
        fetcher.fetch(cache=tmp_path / "cache", lock_path=write_lock(tmp_path / "lock.json", release))
    assert not (tmp_path / "cache").exists()


def test_real_source_matches_the_lock(fetcher, real_source):
    lock = json.loads((Path(fetcher.__file__).parents[2] / "images" / "lock.json").read_text())
    assert fetcher.sha256_file(real_source) == lock["nccl"]["releases"]["2.29.7-1"]["source_sha256"]
    assert real_source.stat().st_size == 1_257_650
