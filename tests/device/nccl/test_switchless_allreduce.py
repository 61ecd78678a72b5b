"""Device lane: build the patched NCCL (the lock's default release, 2.29.7-1, or
$SPARKRING_NCCL_VERSION, e.g. 2.30.7-1) for sm_90 with the module's own recipe
(module_utils/sparkring_nccl.py: pins, the tree pin where the lock has one, preimages) and run a
two-rank all-reduce through it.

Every scenario preloads the built library (LD_PRELOAD, as the launch does) with
NCCL_NVLS_ENABLE=0 and NCCL_ALGO=Ring:
- switchless-ring: NCCL_SWITCHLESS_RING=1 (the launch's setting);
- switchless-ring-eager: the same with NCCL_RUNTIME_CONNECT=0, so init connects every
  algorithm up front: the log must show Tree skipped and never "Connected all trees";
- stock-eager: without the switch, the same library must connect the trees (the control).

    SPARKRING_NCCL_ARCHIVE=... PYTHONPATH=plugins python3 tests/device/nccl/test_switchless_allreduce.py OUTDIR
    pytest -m device tests/device/nccl        # the same, where pytest is installed

Needs a GPU (two ranks share it with their own NCCL_HOSTID where only one is lent: NCCL's
socket transport), nvcc, make, patch, strip and torch; skips otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sparkring.module_utils import load_module_utils

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
NCCL_LOCK = json.loads((ROOT / "images" / "lock.json").read_text())["nccl"]
VERSION = os.environ.get("SPARKRING_NCCL_VERSION", NCCL_LOCK["default_version"])
RELEASE = NCCL_LOCK["releases"][VERSION]
# Where images/nccl/fetch_source.py caches it (the basename of the lock's URL).
ARCHIVE = Path(
    os.environ.get(
        "SPARKRING_NCCL_ARCHIVE", f"/var/cache/sparkring-nccl/src/{RELEASE['source_url'].rsplit('/', 1)[-1]}"
    )
)
MAJOR, MINOR, PATCH = (int(n) for n in VERSION.split("-")[0].split("."))
VERSION_CODE = MAJOR * 10000 + MINOR * 100 + PATCH  # ncclGetVersion's code for 2.x
GENCODE = os.environ.get("SPARKRING_NCCL_GENCODE", "-gencode=arch=compute_90,code=sm_90")
# The kernels these runs use; a full kernel set adds minutes of nvcc and proves nothing more here.
ONLY_FUNCS = os.environ.get("SPARKRING_NCCL_ONLY_FUNCS", "AllReduce Sum f32 * *")
COMMON = {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
SCENARIOS = {
    "switchless-ring": {"NCCL_SWITCHLESS_RING": "1"},
    "switchless-ring-eager": {"NCCL_SWITCHLESS_RING": "1", "NCCL_RUNTIME_CONNECT": "0"},
    "stock-eager": {"NCCL_RUNTIME_CONNECT": "0"},
}
pytestmark = pytest.mark.device


def nccl_utils():
    return load_module_utils("sparkring_nccl")


def missing_prerequisite() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.cuda.device_count() < 1:
        return "needs a GPU, found none"
    for tool in ("make", "patch", "strip", "g++"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not ARCHIVE.is_file():
        return f"the NCCL source archive {ARCHIVE} is not here (set SPARKRING_NCCL_ARCHIVE)"
    return None


def build(out: Path, work: Path, dest: str = "dest") -> dict:
    """The module's recipe: pins, preimages, patch --fuzz=0, make src.build, strip, attest."""
    utils = nccl_utils()
    release = RELEASE
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    request = utils.BuildRequest(
        version=VERSION,
        source_archive=str(ARCHIVE),
        source_sha256=release["source_sha256"],
        source_tree_sha256=release.get("source_tree_sha256"),
        source_dir=release["source_dir"],
        patches=[utils.PatchSpec(str(ROOT / p["file"]), p["sha256"]) for p in release["patches"]],
        dest=str(work / dest),
        work_dir=str(work / "build"),  # outside any git checkout: NCCL stamps the git commit it sits in
        nvcc_gencode=GENCODE,
        only_funcs=ONLY_FUNCS,
        cuda_home=str(Path(nvcc).resolve().parents[1]),
    )
    utils.check_pins(request)
    request.compilers = utils.compiler_versions(request.cuda_home, utils.subprocess_runner)
    attestation = utils.build(request, utils.subprocess_runner)
    (out / f"attestation-{dest}.json").write_text(json.dumps(attestation, indent=2) + "\n")
    return attestation


def run_scenario(name: str, library: Path, out: Path) -> tuple[dict, str]:
    env = os.environ | COMMON | SCENARIOS[name] | {"LD_PRELOAD": str(library)}
    done = subprocess.run(
        [sys.executable, str(HERE / "allreduce_worker.py"), str(out / f"{name}.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = done.stdout + done.stderr
    (out / f"{name}.log").write_text(log)
    report = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").exists() else {}
    assert done.returncode == 0, f"{name}: worker failed (rc {done.returncode}): {log[-3000:]}"
    return report, log


def device_lane(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # A fixed path, like the module's work_dir on every rank: NCCL embeds its build paths.
    scratch = Path(tempfile.gettempdir()) / "sparkring-nccl-device"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        started = time.monotonic()
        attestation = build(out, scratch)
        summary = {"attestation": attestation, "build_seconds": round(time.monotonic() - started)}
        library = scratch / "dest" / "lib" / "libnccl.so.2"
        summary["scenarios"] = {name: run_checked(name, library, out) for name in SCENARIOS}
        # Every rank builds for itself, so launch attestation needs byte-identical builds.
        summary["rebuild_sha256"] = build(out, scratch, dest="dest-again")["output"]["sha256"]
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    eager, stock = summary["scenarios"]["switchless-ring-eager"], summary["scenarios"]["stock-eager"]
    assert eager["tree_skipped"] and not eager["trees_connected"], eager
    assert stock["trees_connected"] and not stock["tree_skipped"], stock
    assert summary["rebuild_sha256"] == attestation["output"]["sha256"], (
        "two builds of the same inputs differ"
    )
    return summary


def run_checked(name: str, library: Path, out: Path) -> dict:
    report, log = run_scenario(name, library, out)
    assert [r["rank"] for r in report["ranks"]] == [0, 1], report
    # torch maps its bundled libnccl too; symbol lookup still resolves the preloaded one,
    # and the communicator's own banner says which library initialised it.
    banner = f"NCCL INFO NCCL version {MAJOR}.{MINOR}.{PATCH}+"
    assert log.count(banner) == 2 and "NCCL version 2.28" not in log, name
    for rank in report["ranks"]:
        assert rank["nccl_version"] == VERSION_CODE, rank
        assert str(library) in rank["libnccl"].split(","), rank
        for check in rank["checks"]:
            assert check["constant_ok"] and check["random_mismatches"] == 0, (name, rank)
    return {
        "ranks_ok": len(report["ranks"]),
        "elements_checked": [c["elements"] for c in report["ranks"][0]["checks"]],
        "nccl_version": report["ranks"][0]["nccl_version"],
        "libnccl_mapped": report["ranks"][0]["libnccl"].split(","),
        "switch_read": "NCCL_SWITCHLESS_RING set by environment to 1" in log,
        "tree_skipped": "NCCL_SWITCHLESS_RING set: skipping Tree connections" in log,
        "trees_connected": "Connected all trees" in log,
        "rings_connected": "Connected all rings" in log,
    }


def test_patched_nccl_builds_and_all_reduces_on_two_ranks(tmp_path):
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    device_lane(Path(os.environ.get("SPARKRING_DEVICE_OUT", tmp_path)))


if __name__ == "__main__":
    problem = missing_prerequisite()
    if problem:
        sys.exit(f"device lane cannot run: {problem}")
    print(json.dumps(device_lane(Path(sys.argv[1])), indent=2))
