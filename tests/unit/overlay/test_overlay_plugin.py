"""The entry point refuses in a way nothing can swallow: os._exit with a message naming the patch.

Each case runs the registered function in a fresh interpreter inside ``try/except
BaseException`` (what a careless caller would do) against a stand-in ``vllm`` distribution
whose version, source files and image record (its overlay pins) the test controls.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from overlay import registry
from overlay.plugin import EXIT_REFUSED

REPO = Path(__file__).resolve().parents[3]
CALLER = textwrap.dedent(
    """
    from overlay.plugin import register
    try:
        register()
    except BaseException as exc:
        print("SWALLOWED", type(exc).__name__)
    print("RETURNED")
    """
)


def fake_vllm(root: Path, version: str) -> Path:
    """A ``vllm`` distribution at ``version`` whose patched files are empty stand-ins."""
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    for patch in registry.PATCHES:
        path = root / patch.file
        for parent in [p for p in path.parents if p != root and root in p.parents]:
            parent.mkdir(parents=True, exist_ok=True)
            (parent / "__init__.py").touch()
        path.write_text("# not the upstream file\n")
    return root


PINNED = hashlib.sha256(b"# the upstream file\n").hexdigest()


def image_record(root: Path, pins: dict | None) -> Path:
    """The image's build record (/opt/sparkring/image.json) with these overlay pins."""
    path = root / "image.json"
    path.write_text(json.dumps({"flavor": "sim", "vllm_origin": "test", "overlay_pins": pins}))
    return path


def pins(version: str = "0.32.0+cpu", wrappers: str = "0.32.0") -> dict:
    files = {patch.file: PINNED for patch in registry.PATCHES}
    return {"image": "test", "vllm_version": version, "wrappers": wrappers, "files": files}


def run_register(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPARKRING_")}
    full.update(PYTHONPATH=os.pathsep.join([str(root), str(REPO)]), **env)
    return subprocess.run(
        [sys.executable, "-c", CALLER], env=full, capture_output=True, text=True, timeout=60, check=False
    )


RING = {"SPARKRING_RING_PREFIX": "127.77"}


def test_changed_upstream_file_exits_nonzero_naming_each_patch_and_hashes(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path, "0.32.0+cpu")
    record = image_record(tmp_path, pins())
    done = run_register(root, SPARKRING_OVERLAY_MODE="custom", SPARKRING_IMAGE_JSON=str(record), **RING)
    assert done.returncode == EXIT_REFUSED, done
    assert "SWALLOWED" not in done.stdout and "RETURNED" not in done.stdout
    assert "REFUSING TO START" in done.stderr
    found = registry.file_sha256(root / "vllm/distributed/device_communicators/cpu_communicator.py")
    for patch in registry.PATCHES:
        assert f"patch {patch.name!r}" in done.stderr
    assert f"expected sha256 {PINNED}, found {found}" in done.stderr
    assert "nothing was patched" in done.stderr


@pytest.mark.parametrize("mode", ["custom", "shadow"])
def test_an_image_without_pins_refuses_unless_disabled(tmp_path: Path, mode: str) -> None:
    root = fake_vllm(tmp_path, "0.11.2.dev279+eldritch")
    record = image_record(tmp_path, None)
    done = run_register(root, SPARKRING_OVERLAY_MODE=mode, SPARKRING_IMAGE_JSON=str(record), **RING)
    assert done.returncode == EXIT_REFUSED, done
    assert f"this image has no overlay pins for its vLLM 0.11.2.dev279+eldritch ({record})" in done.stderr
    assert "playbooks/overlay-pins.yml --check --diff" in done.stderr
    assert "OVERLAY_MODE=disabled" in done.stderr
    assert "RETURNED" not in done.stdout


def test_pins_for_another_vllm_or_unknown_wrappers_or_no_record_refuse(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path, "0.33.0+cpu")
    env = {"SPARKRING_OVERLAY_MODE": "custom", **RING}
    done = run_register(root, SPARKRING_IMAGE_JSON=str(image_record(tmp_path, pins())), **env)
    assert done.returncode == EXIT_REFUSED, done
    assert (
        "vLLM 0.33.0+cpu is installed, but this image's overlay pins are for vLLM 0.32.0+cpu" in done.stderr
    )
    done = run_register(
        root, SPARKRING_IMAGE_JSON=str(image_record(tmp_path, pins("0.33.0+cpu", "0.33.0"))), **env
    )
    assert done.returncode == EXIT_REFUSED, done
    assert "wrappers for vLLM 0.33.0, and this overlay has wrappers for 0.32.0 only" in done.stderr
    done = run_register(root, SPARKRING_IMAGE_JSON=str(tmp_path / "absent.json"), **env)
    assert done.returncode == EXIT_REFUSED, done
    assert "cannot read the image record" in done.stderr


def test_disabled_and_unset_modes_touch_nothing(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path, "0.33.0")
    for env in ({"SPARKRING_OVERLAY_MODE": "disabled"}, {}):
        done = run_register(root, **env)
        assert done.returncode == 0, done
        assert done.stdout.split() == ["RETURNED"]


def test_bad_mode_and_missing_ring_refuse(tmp_path: Path) -> None:
    root = fake_vllm(tmp_path, "0.32.0+cpu")
    done = run_register(root, SPARKRING_OVERLAY_MODE="fast")
    assert done.returncode == EXIT_REFUSED
    assert "SPARKRING_OVERLAY_MODE='fast' is not one of disabled, shadow, custom" in done.stderr
    done = run_register(root, SPARKRING_OVERLAY_MODE="custom")
    assert done.returncode == EXIT_REFUSED
    assert "SPARKRING_RING_SPEC" in done.stderr
