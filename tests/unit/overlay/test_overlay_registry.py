"""The patch registry: wrapper releases, the image record's pins, and sha256 checks of upstream files."""

import hashlib
import json
import sys
from pathlib import Path

import pytest

from overlay import pins as overlay_pins
from overlay import registry
from overlay.registry import Patch, Pins


def test_every_patch_names_a_wrapped_release_a_file_and_a_platform() -> None:
    for patch in registry.PATCHES:
        assert patch.written_for in registry.WRAPPED_RELEASES
        assert patch.file.startswith("vllm/") and patch.file.endswith(".py")
        assert patch.platform in ("cpu", "cuda", "any")
    assert registry.patches_for("0.32.0") == registry.PATCHES
    assert registry.patches_for("0.32.1") == ()


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


def _patch() -> Patch:
    return Patch("fake-all-reduce", "0.32.0", "sr_fake_vllm.comm", "Comm.all_reduce", "x.y", "any")


def _pins(files: dict[str, str]) -> Pins:
    return Pins("fake-origin", "0.32.0+cpu", "0.32.0", files)


def test_pinned_file_passes_and_one_changed_byte_names_patch_and_both_hashes(fake_upstream: Path) -> None:
    root = fake_upstream.parents[1]
    good = hashlib.sha256(fake_upstream.read_bytes()).hexdigest()
    assert registry.verify((_patch(),), _pins({"sr_fake_vllm/comm.py": good}), root) == []
    assert "sr_fake_vllm.comm" not in sys.modules  # hashed from disk, not executed
    data = bytearray(fake_upstream.read_bytes())
    data[-2] ^= 0x01
    fake_upstream.write_bytes(bytes(data))
    [bad] = registry.verify((_patch(),), _pins({"sr_fake_vllm/comm.py": good}), root)
    found = hashlib.sha256(bytes(data)).hexdigest()
    assert (bad.expected, bad.found) == (good, found)
    assert str(bad) == (
        f"patch 'fake-all-reduce' (sr_fake_vllm.comm.Comm.all_reduce): expected sha256 {good}, found {found}"
    )


def test_unpinned_and_missing_files_are_mismatches(fake_upstream: Path) -> None:
    root = fake_upstream.parents[1]
    [unpinned] = registry.verify((_patch(),), _pins({}), root)
    assert unpinned.expected == "<unpinned>"
    gone = Patch("gone", "0.32.0", "sr_fake_vllm.nothing_here", "f", "x.y", "any")
    [missing] = registry.verify((gone,), _pins({gone.file: "0" * 64}), root)
    assert missing.found == "<missing>"


def test_pins_come_from_the_image_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "image.json"
    pins = {
        "image": "o",
        "vllm_version": "0.32.0+cpu",
        "wrappers": "0.32.0",
        "files": {"vllm/a.py": "0" * 64},
    }
    record.write_text(json.dumps({"flavor": "sim", "overlay_pins": pins}))
    monkeypatch.setenv("SPARKRING_IMAGE_JSON", str(record))
    assert registry.load_pins() == Pins("o", "0.32.0+cpu", "0.32.0", {"vllm/a.py": "0" * 64})
    record.write_text(json.dumps({"flavor": "sim", "overlay_pins": None}))
    assert registry.load_pins() is None
    record.write_text(json.dumps({"overlay_pins": {"image": "o"}}))
    with pytest.raises(registry.PinsError, match="overlay_pins is malformed"):
        registry.load_pins()
    with pytest.raises(registry.PinsError, match="cannot read the image record"):
        registry.load_pins(str(tmp_path / "absent.json"))


SOURCE = '''import functools


class Comm:
    """A communicator."""

    @functools.cache
    def all_reduce(self, x):
        return x

    def other(self):
        pass


def cp_lse_ag_out_rs(a, b):
    return a
'''


def test_function_source_finds_methods_with_decorators_and_functions() -> None:
    assert overlay_pins.function_source(SOURCE, "Comm.all_reduce") == (
        "    @functools.cache\n    def all_reduce(self, x):\n        return x\n"
    )
    assert (
        overlay_pins.function_source(SOURCE, "cp_lse_ag_out_rs")
        == "def cp_lse_ag_out_rs(a, b):\n    return a\n"
    )
    assert overlay_pins.function_source(SOURCE, "Comm.absent") is None
    assert overlay_pins.function_source(SOURCE, "Absent.all_reduce") is None


def test_the_lock_installs_the_vllm_the_newest_wrappers_were_written_for() -> None:
    """One source per fact: the lock names the vLLM every image installs, the registry the release its
    wrappers target; the newest wrapped release is the lock's, or the overlay would refuse every image."""
    from sparkring.lock import load_lock

    assert registry.WRAPPED_RELEASES[-1] == load_lock().vllm.version
