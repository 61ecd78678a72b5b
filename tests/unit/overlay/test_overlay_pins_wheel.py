"""Overlay pins measured in a vLLM wheel file (the upstream flavor's origin), never installed.

The wheel here is built from the stored source of the functions the wrappers were written for
(overlay/upstream/vllm-0.32.0.json), so what the measurement finds is known byte for byte; the
pin module (library/sparkring_overlay_pins, wheel=) runs as Ansible runs it."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest
from ansible.module_utils.testing import patch_module_args

from overlay.pins import measure_wheel, reference_path
from overlay.registry import patches_for
from tests.project_code import load_library_module

REFERENCE = json.loads(reference_path("0.32.0").read_text())


def pin_module() -> ModuleType:
    return load_library_module("sparkring_overlay_pins")


def run_module(args: dict, capsys: pytest.CaptureFixture[str]) -> dict:
    with patch_module_args(args), pytest.raises(SystemExit):
        pin_module().main()
    return json.loads(capsys.readouterr().out)


def sources(without: str = "") -> dict[str, str]:
    """Each target file as the reference's functions make it (methods inside their classes)."""
    files: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key, source in REFERENCE["functions"].items():
        path, qualname = key.split(":")
        owner = qualname.split(".")[0] if "." in qualname else ""
        files[path][owner].append(source)
    return {
        path: "".join(
            (f"class {owner}:\n" if owner else "") + "\n".join(functions)
            for owner, functions in owners.items()
        )
        for path, owners in files.items()
        if path != without
    }


def vllm_wheel(folder: Path, without: str = "") -> Path:
    path = folder / "vllm-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in sources(without).items():
            wheel.writestr(name, text)
        wheel.writestr("vllm/__init__.py", "")
        wheel.writestr(
            "vllm-0.32.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n"
        )
    return path


def test_a_wheel_is_measured_as_an_image_that_installs_it_would_be(tmp_path: Path) -> None:
    wheel = vllm_wheel(tmp_path)
    measured = measure_wheel(wheel, "0.32.0")
    assert measured["vllm_version"] == "0.32.0"
    assert measured["vllm_origin"] == f"{wheel.name}@sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"
    assert [t["patch"] for t in measured["targets"]] == [p.name for p in patches_for("0.32.0")]
    for target in measured["targets"]:
        assert target["sha256"] == hashlib.sha256(sources()[target["file"]].encode()).hexdigest()
        assert target["source"] == REFERENCE["functions"][f"{target['file']}:{target['qualname']}"]


def test_the_pin_module_pins_a_wheel_with_diffs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = vllm_wheel(tmp_path)
    args = {"wheel": str(wheel), "wrappers": "0.32.0", "reference": REFERENCE, "_ansible_diff": True}
    result = run_module(args, capsys)
    assert not result.get("failed"), result
    measured = measure_wheel(wheel, "0.32.0")
    assert result["pins"] == {
        "image": measured["vllm_origin"],
        "vllm_version": "0.32.0",
        "wrappers": "0.32.0",
        "files": {t["file"]: t["sha256"] for t in measured["targets"]},
    }
    assert all(t["identical"] and t["diff"] == "" for t in result["targets"])
    assert len(result["targets"]) == len(patches_for("0.32.0"))
    assert result["changed"] is False and "diff" not in result  # a measurement changes nothing


def test_a_wheel_without_a_target_file_is_refused_naming_the_patch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = vllm_wheel(tmp_path, without="vllm/v1/attention/ops/dcp.py")
    result = run_module({"wheel": str(wheel), "wrappers": "0.32.0", "reference": REFERENCE}, capsys)
    assert result["failed"]
    assert result["msg"].startswith(
        "patch 'dcp-lse-combine' (vllm/v1/attention/ops/dcp.py:cp_lse_ag_out_rs): no such file in "
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "one of the following is required: image, wheel"),
        ({"image": "x", "wheel": "/w.whl"}, "parameters are mutually exclusive: image|wheel"),
    ],
)
def test_the_module_measures_an_image_or_a_wheel(args: dict, message: str, capsys) -> None:
    result = run_module(args | {"wrappers": "0.32.0", "reference": REFERENCE}, capsys)
    assert result["failed"] and message in result["msg"]
