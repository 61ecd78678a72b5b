"""The committed patches against the real NCCL 2.29.7 source (Debian sid contrib `nvidia-nccl`,
fetched once into /var/cache/sparkring-nccl): they apply with no fuzz after their preimage
check, a tampered source is refused, and the patched translation units compile with nvcc.

What compiles: only the three files the patches touch (src/transport/generic.cc,
src/graph/tuning.cc, src/transport/net_ib/connect.cc), through NCCL's own make rule for each
object (which first generates the headers they include, e.g. nccl.h), with CXX set to nvcc
(host C++ forwarded to g++). A full NCCL build takes ~7 minutes on two cores: the device lane
does that (tests/device/nccl/).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
REAL_VERSION = "2.29.7-1"
LOCK = json.loads((ROOT / "images" / "lock.json").read_text())
RELEASE = LOCK["nccl"]["releases"][REAL_VERSION]
TOUCHED = ["src/transport/generic.cc", "src/graph/tuning.cc", "src/transport/net_ib/connect.cc"]


def request_for(nccl_utils, archive: Path, tmp: Path, version: str = REAL_VERSION, sha: str | None = None):
    release = LOCK["nccl"]["releases"][REAL_VERSION]
    return nccl_utils.BuildRequest(
        version=version,
        source_archive=str(archive),
        source_sha256=sha or release["source_sha256"],
        source_dir=release["source_dir"],
        patches=[nccl_utils.PatchSpec(str(ROOT / p["file"]), p["sha256"]) for p in release["patches"]],
        dest=str(tmp / "dest"),
        work_dir=str(tmp / "work"),
    )


@pytest.fixture(scope="module")
def patched_tree(nccl_utils, real_source, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("nccl-real")
    request = request_for(nccl_utils, real_source, tmp)
    nccl_utils.check_pins(request)
    tree = nccl_utils.extract_source(str(real_source), request.source_dir, tmp / "src")
    nccl_utils.apply_patches(tree, request.patches, nccl_utils.subprocess_runner)
    return tree


def test_lock_pins_every_committed_patch(nccl_utils):
    for version, release in LOCK["nccl"]["releases"].items():
        assert release["patches"], version
        for patch in release["patches"]:
            path = ROOT / patch["file"]
            assert path.parent.name == version and nccl_utils.sha256_file(path) == patch["sha256"]
    for version in ("2.29.7-1", "2.30.7-1"):
        patches = sorted((ROOT / "images" / "nccl" / "patches" / version).glob("*.patch"))
        assert [p.name[:4] for p in patches] == ["0001", "0002"]
        touched = [f for p in patches for f in nccl_utils.parse_patch(p.read_text(), p.name).touched]
        assert touched == TOUCHED, version


def test_patches_apply_to_the_real_source(patched_tree):
    generic = (patched_tree / "src/transport/generic.cc").read_text()
    assert 'NCCL_PARAM(SwitchlessRing, "SWITCHLESS_RING", 0);' in generic
    assert generic.count("if (ncclParamSwitchlessRing()) {") == 2  # Tree and PAT
    tuning = (patched_tree / "src/graph/tuning.cc").read_text()
    assert "a == NCCL_ALGO_TREE || a == NCCL_ALGO_PAT" in tuning
    connect = (patched_tree / "src/transport/net_ib/connect.cc").read_text()
    assert (
        "union ibv_gid listenGids[2];" in connect
        and "ncclIbSwitchlessListenGids(dev, handle->listenGids)" in connect
    )
    assert not list(patched_tree.rglob("*.orig")) and not list(patched_tree.rglob("*.rej"))


def test_patched_translation_units_compile_with_nvcc(patched_tree, nvcc, tmp_path):
    build = tmp_path / "build"
    objects = [str(build / "obj" / Path(f).relative_to("src").with_suffix(".o")) for f in TOUCHED]
    done = subprocess.run(
        [
            "make",
            "-C",
            str(patched_tree / "src"),
            f"BUILDDIR={build}",
            f"CXX={nvcc} -ccbin g++ --forward-unknown-to-host-compiler",
            *objects,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "warning" not in done.stderr.lower(), done.stderr[-4000:]
    symbols = {
        Path(obj).name: subprocess.run(["nm", "-C", obj], capture_output=True, text=True, check=True).stdout
        for obj in objects
    }
    assert " T ncclParamSwitchlessRing()" in symbols["generic.o"]
    assert " U ncclParamSwitchlessRing()" in symbols["tuning.o"]
    assert " U ncclParamSwitchlessRing()" in symbols["connect.o"]
    assert " T ncclParamIbSubnetPrefixLen()" in symbols["connect.o"]


def test_byte_changed_archive_is_refused(nccl_utils, real_source, tmp_path):
    tampered = tmp_path / real_source.name
    data = bytearray(real_source.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(nccl_utils.NcclBuildError, match="not the pinned NCCL source") as error:
        nccl_utils.check_pins(request_for(nccl_utils, tampered, tmp_path))
    assert error.value.field == "source_sha256"


def test_repacked_source_with_a_changed_file_fails_the_preimage_check(nccl_utils, real_source, tmp_path):
    """Even if a lock were re-pinned to a modified archive, the patches refuse the wrong preimage."""
    unpacked = nccl_utils.extract_source(str(real_source), RELEASE["source_dir"], tmp_path / "u")
    generic = unpacked / "src/transport/generic.cc"
    generic.write_text(generic.read_text() + "// drift\n")
    repacked = tmp_path / "repacked.tar.gz"
    with tarfile.open(repacked, "w:gz") as tar:
        tar.add(unpacked, arcname=RELEASE["source_dir"])
    request = request_for(nccl_utils, repacked, tmp_path, sha=nccl_utils.sha256_file(repacked))
    nccl_utils.check_pins(request)
    tree = nccl_utils.extract_source(str(repacked), request.source_dir, tmp_path / "w")
    with pytest.raises(nccl_utils.NcclBuildError, match=r"src/transport/generic\.cc has sha256") as error:
        nccl_utils.apply_patches(tree, request.patches, nccl_utils.subprocess_runner)
    assert error.value.field == "preimage"
    assert (
        "SwitchlessRing" not in generic.read_text()
        and "SwitchlessRing" not in (tree / "src/transport/generic.cc").read_text()
    )


def test_other_release_patches_are_refused_on_this_source(nccl_utils, real_source, tmp_path):
    tree = nccl_utils.extract_source(str(real_source), RELEASE["source_dir"], tmp_path / "src")
    patches = sorted((ROOT / "images" / "nccl" / "patches" / "2.30.7-1").glob("*.patch"))
    specs = [nccl_utils.PatchSpec(str(p), nccl_utils.sha256_file(p)) for p in patches]
    with pytest.raises(nccl_utils.NcclBuildError, match="the patch was written for"):
        nccl_utils.apply_patches(tree, specs, nccl_utils.subprocess_runner)
