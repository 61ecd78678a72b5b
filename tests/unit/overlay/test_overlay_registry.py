"""The patch registry: versions, and sha256 checks of the upstream files a patch expects."""

import hashlib
import sys
from pathlib import Path

import pytest

from overlay import registry
from overlay.registry import Patch


def test_every_patch_names_a_known_version_and_a_sha256() -> None:
    for patch in registry.PATCHES:
        assert patch.vllm_version in registry.KNOWN_VLLM_VERSIONS
        assert len(patch.sha256) == 64 and int(patch.sha256, 16) >= 0
        assert patch.platform in ("cpu", "cuda", "any")


def test_local_build_tag_selects_the_release_and_unknown_versions_select_nothing() -> None:
    assert registry.patches_for("0.32.0+cpu") == registry.patches_for("0.32.0") == registry.PATCHES
    assert registry.patches_for("0.32.1") == ()
    assert registry.patches_for("0.31.0+cpu") == ()


@pytest.fixture
def fake_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package ``sr_fake_vllm`` with one module, importable, never imported by the check."""
    pkg = tmp_path / "sr_fake_vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "comm.py").write_text("class Comm:\n    def all_reduce(self, x):\n        return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg / "comm.py"
    sys.modules.pop("sr_fake_vllm", None)


def _patch(sha: str) -> Patch:
    return Patch("fake-all-reduce", "0.32.0", "sr_fake_vllm.comm", "Comm.all_reduce", sha, "x.y", "any")


def test_matching_file_passes_and_one_changed_byte_names_patch_and_both_hashes(fake_upstream: Path) -> None:
    good = hashlib.sha256(fake_upstream.read_bytes()).hexdigest()
    assert registry.verify((_patch(good),)) == []
    assert "sr_fake_vllm.comm" not in sys.modules  # hashed from disk, not executed
    data = bytearray(fake_upstream.read_bytes())
    data[-2] ^= 0x01
    fake_upstream.write_bytes(bytes(data))
    [bad] = registry.verify((_patch(good),))
    found = hashlib.sha256(bytes(data)).hexdigest()
    assert bad.found == found
    assert str(bad) == (
        f"patch 'fake-all-reduce' (sr_fake_vllm.comm.Comm.all_reduce): expected sha256 {good}, found {found}"
    )


def test_missing_upstream_module_is_a_mismatch(fake_upstream: Path) -> None:
    patch = Patch("gone", "0.32.0", "sr_fake_vllm.nothing_here", "f", "0" * 64, "x.y", "any")
    [bad] = registry.verify((patch,))
    assert bad.found == "<missing>"
