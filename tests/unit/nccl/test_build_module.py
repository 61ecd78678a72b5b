"""sparkring_nccl_build on the fixture source: a real nvcc build, pins, preimages, idempotence,
check mode and diff. (The real NCCL source is exercised in test_real_source.py.)"""

from __future__ import annotations

import ctypes
import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from transport.integrity import package_files, tree_sha256


def library_of(result: dict) -> Path:
    return Path(result["library"])


def test_build_installs_the_patched_library_with_its_attestation(nvcc, run_module, fixture_source):
    result = run_module(fixture_source)
    assert result["changed"] is True, result
    library = library_of(result)
    assert library == Path(fixture_source["dest"]) / "lib" / "libnccl.so.2" and not library.is_symlink()
    assert result["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    # The patch really reached the build: the fixture returns its SWITCHLESS_RING macro.
    assert ctypes.CDLL(str(library)).fixtureSwitchlessRing() == 1
    attestation = json.loads(Path(result["attestation_path"]).read_text())
    assert attestation == result["attestation"]
    assert attestation["source"]["sha256"] == fixture_source["source_sha256"]
    assert attestation["patches"][0]["sha256"] == fixture_source["patches"][0]["sha256"]
    assert list(attestation["patches"][0]["preimages"]) == ["src/ring.h"]
    assert "release 13" in attestation["compilers"]["nvcc"] or "release" in attestation["compilers"]["nvcc"]
    assert attestation["compilers"]["cxx"].startswith("g++")
    assert attestation["flags"]["NVCC_GENCODE"] == "-gencode=arch=compute_121,code=sm_121"
    assert attestation["output"]["sha256"] == result["sha256"]
    # The build tree is removed after install; the last progress report stays for whoever watched.
    assert [p.name for p in Path(fixture_source["work_dir"]).iterdir()] == ["progress.json"]
    assert "(done)" in json.loads((Path(fixture_source["work_dir"]) / "progress.json").read_text())["phase"]


def test_same_inputs_do_not_rebuild_and_check_mode_agrees(nvcc, run_module, fixture_source):
    first = run_module(fixture_source)
    mtime = library_of(first).stat().st_mtime_ns
    again = run_module(fixture_source)
    planned = run_module(fixture_source, check=True, diff=True)
    assert again["changed"] is False and planned["changed"] is False
    assert again["sha256"] == first["sha256"] and library_of(again).stat().st_mtime_ns == mtime
    assert "diff" not in planned


def test_check_mode_plans_without_building(nvcc, run_module, fixture_source):
    result = run_module(fixture_source, check=True, diff=True)
    assert result["changed"] is True and result["msg"].startswith(
        "would build NCCL 0.0.1-fixture with 1 patch"
    )
    assert not Path(fixture_source["dest"]).exists()
    assert result["diff"]["before"] == ""
    assert json.loads(result["diff"]["after"])["source_sha256"] == fixture_source["source_sha256"]


def test_a_new_gencode_rebuilds_and_diffs(nvcc, run_module, fixture_source):
    built = run_module(fixture_source)
    args = fixture_source | {"nvcc_gencode": "-gencode=arch=compute_90,code=sm_90"}
    planned = run_module(args, check=True, diff=True)
    assert planned["changed"] is True and planned["inputs_sha256"] != built["inputs_sha256"]
    assert "compute_121" in planned["diff"]["before"] and "compute_90" in planned["diff"]["after"]
    rebuilt = run_module(args)
    assert rebuilt["changed"] is True and rebuilt["attestation"]["flags"]["NVCC_GENCODE"].endswith("sm_90")


def test_a_library_that_no_longer_matches_its_attestation_is_rebuilt(nvcc, run_module, fixture_source):
    built = run_module(fixture_source)
    library_of(built).write_bytes(b"not the attested library")
    rebuilt = run_module(fixture_source)
    assert rebuilt["changed"] is True and rebuilt["sha256"] == built["sha256"]


def test_tampered_archive_is_refused(run_module, fixture_source, without_cuda):
    archive = Path(fixture_source["source_archive"])
    archive.write_bytes(archive.read_bytes() + b"\0")
    result = run_module(fixture_source | without_cuda)
    assert result["failed"] and result["field"] == "source_sha256"
    assert "not the pinned NCCL source" in result["msg"]
    assert not Path(fixture_source["dest"]).exists()


def test_unpinned_release_is_refused(run_module, fixture_source, without_cuda):
    result = run_module(fixture_source | without_cuda | {"source_sha256": None})
    assert (
        result["failed"] and result["field"] == "source_sha256" and "no pinned source sha256" in result["msg"]
    )


def tree_pinned(fixture_source: dict, fixture_lib, tmp_path: Path) -> dict:
    """The fixture pinned by its unpacked tree, its archive repacked (other bytes, same tree)."""
    repacked = tmp_path / "repacked.tar"
    with tarfile.open(fixture_source["source_archive"]) as src, tarfile.open(repacked, "w") as dst:
        for member in reversed(src.getmembers()):
            member.mtime, member.uid = 1_700_000_000, 1000
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    tree = tmp_path / "unpacked"
    with tarfile.open(repacked) as tar:
        tar.extractall(tree, filter="data")
    digest = tree_sha256(tree / fixture_lib.SOURCE_DIR, package_files(tree / fixture_lib.SOURCE_DIR))
    return fixture_source | {
        "source_archive": str(repacked),
        "source_sha256": None,
        "source_tree_sha256": digest,
    }


def test_a_source_pinned_by_its_tree_builds_from_any_packing(
    nvcc, run_module, fixture_source, fixture_lib, tmp_path
):
    args = tree_pinned(fixture_source, fixture_lib, tmp_path)
    result = run_module(args)
    assert result["changed"] is True and ctypes.CDLL(str(library_of(result))).fixtureSwitchlessRing() == 1
    source = result["attestation"]["source"]
    assert source == {
        "sha256": None,
        "tree_sha256": args["source_tree_sha256"],
        "dir": fixture_lib.SOURCE_DIR,
    }


def test_a_tree_that_is_not_the_pin_is_refused_before_the_toolchain(
    run_module, fixture_source, fixture_lib, tmp_path, without_cuda
):
    args = tree_pinned(fixture_source, fixture_lib, tmp_path)
    assert run_module(args | without_cuda)["field"] == "cuda_home"  # the pin held: on to the toolchain
    result = run_module(args | without_cuda | {"source_tree_sha256": "0" * 64})
    assert result["failed"] and result["field"] == "source_tree_sha256"
    assert "unpacks to a tree with digest" in result["msg"] and not Path(fixture_source["dest"]).exists()


def test_tampered_patch_is_refused(run_module, fixture_source, without_cuda):
    patch = Path(fixture_source["patches"][0]["path"])
    patch.write_text(patch.read_text().replace("SWITCHLESS_RING 1", "SWITCHLESS_RING 2"))
    result = run_module(fixture_source | without_cuda, check=True)
    assert result["failed"] and result["field"] == "patches" and "the lock pins" in result["msg"]


def test_source_that_is_not_the_patch_preimage_is_refused(
    run_module, fixture_source, fixture_lib, tmp_path, without_cuda
):
    """A pinned archive (the lock agrees with it) whose file differs from what the patch expects."""
    fixture = fixture_lib
    other = tmp_path / "other.tar.gz"
    sha = fixture.write_archive(
        other, fixture.FILES | {"src/ring.h": "#define SWITCHLESS_RING 0 /* drift */\n"}
    )
    result = run_module(fixture_source | without_cuda | {"source_archive": str(other), "source_sha256": sha})
    assert result["failed"] and result["field"] == "preimage" and "src/ring.h" in result["msg"]
    assert not Path(fixture_source["dest"]).exists()


def test_archive_with_another_top_directory_is_refused(
    run_module, fixture_source, fixture_lib, tmp_path, without_cuda
):
    fixture = fixture_lib
    other = tmp_path / "renamed.tar.gz"
    sha = fixture.write_archive(other, fixture.FILES, top="nccl-other")
    result = run_module(fixture_source | without_cuda | {"source_archive": str(other), "source_sha256": sha})
    assert result["failed"] and result["field"] == "source_dir"


@pytest.mark.parametrize(
    ("header", "error"),
    [
        ("", "without a preimage: ['src/ring.h']"),
        (f"Preimage-SHA256: {'0' * 64}  src/other.h\n", "preimage for an untouched file: ['src/other.h']"),
    ],
)
def test_patch_preimage_lines_must_cover_exactly_the_touched_files(nccl_utils, fixture_lib, header, error):
    text = header + fixture_lib.PATCH_BODY
    if "other.h" in header:
        text = f"Preimage-SHA256: {'1' * 64}  src/ring.h\n" + text
    with pytest.raises(nccl_utils.NcclBuildError, match=error.replace("[", r"\[").replace("]", r"\]")):
        nccl_utils.parse_patch(text, "x.patch")


def test_archive_members_may_not_leave_the_tree(nccl_utils, tmp_path):
    import io
    import tarfile

    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("nccl-x/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        tar.addfile(link)
        tar.addfile(tarfile.TarInfo("nccl-x/ok"), io.BytesIO(b""))
    with pytest.raises(nccl_utils.NcclBuildError, match="refusing member 'nccl-x/escape'"):
        nccl_utils.extract_source(str(archive), "nccl-x", tmp_path / "out")
    assert not (tmp_path / "out" / "nccl-x").exists()


def test_two_builds_of_the_same_inputs_are_byte_identical(nvcc, run_module, fixture_source, tmp_path):
    """Every rank builds for itself; launch attestation needs the same sha256 on all of them."""
    first = run_module(fixture_source)
    second = run_module(fixture_source | {"dest": str(tmp_path / "other" / "nccl")})
    assert second["changed"] is True and second["sha256"] == first["sha256"]


def test_check_mode_before_the_source_arrives_reports_instead_of_refusing(
    nvcc, run_module, fixture_source, tmp_path
):
    missing = str(tmp_path / "not-copied-yet.tar.gz")
    planned = run_module(fixture_source | {"source_archive": missing}, check=True)
    assert (
        planned["changed"] is True and "not on the node yet" in planned["msg"] and missing in planned["msg"]
    )


def test_a_missing_source_is_refused_outside_check_mode(run_module, fixture_source, tmp_path, without_cuda):
    missing = str(tmp_path / "not-copied-yet.tar.gz")
    refused = run_module(fixture_source | without_cuda | {"source_archive": missing})
    assert refused["failed"] and refused["field"] == "source_archive"


@pytest.mark.parametrize("check", [False, True])
def test_good_inputs_on_a_node_without_nvcc_are_refused_naming_cuda_home(
    run_module, fixture_source, without_cuda, check
):
    """Check mode plans what the run would do: both refuse, naming the toolkit, and build nothing."""
    result = run_module(fixture_source | without_cuda, check=check)
    assert result["failed"] and result["field"] == "cuda_home" and "no-cuda-toolkit/bin/nvcc" in result["msg"]
    assert not Path(fixture_source["dest"]).exists()
