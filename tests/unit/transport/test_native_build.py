"""The build stage's helper builds exactly the libraries the transport loads, and records them.

roles/transport_build/files/build_engine.py runs on every node; here it runs for real into a
fresh cache: the host libraries with the C compiler, the GPU producer with nvcc (it compiles
here for sm_121 and sm_90; nothing CUDA runs on this machine).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transport import _native

ROOT = Path(__file__).resolve().parents[3]
HELPER = ROOT / "roles" / "transport_build" / "files" / "build_engine.py"


def helper(cache: Path, *args: str) -> dict:
    env = {**os.environ, "SPARKRING_TRANSPORT_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(HELPER), *args], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_inspect_builds_nothing_then_a_build_records_each_library(tmp_path: Path) -> None:
    plan = helper(tmp_path, "--inspect")
    assert plan["needs_build"] is True
    assert set(plan["libraries"]) == {"libsr_engine.so", "libsr_progress.so"}
    assert all(lib["sha256"] is None for lib in plan["libraries"].values())
    assert not list(tmp_path.rglob("*.so"))
    built = helper(tmp_path)
    for lib in built["libraries"].values():
        assert hashlib.sha256(Path(lib["path"]).read_bytes()).hexdigest() == lib["sha256"]
    assert helper(tmp_path, "--inspect")["needs_build"] is False


@pytest.mark.parametrize("arch", ["sm_121", "sm_90"])
def test_the_gpu_producer_is_built_with_nvcc_for_the_node_architecture(tmp_path: Path, arch: str) -> None:
    try:
        _native.nvcc()
    except _native.NativeBuildError as exc:
        pytest.skip(str(exc))
    built = helper(tmp_path, "--cuda-arch", arch)
    lib = built["libraries"]["libsr_gpu.so"]
    assert Path(lib["path"]).is_file() and len(lib["sha256"]) == 64
    # The architecture is part of the cache key: a GB10 build and an H200 build never collide.
    assert _native.gpu_library("sm_121").path() != _native.gpu_library("sm_90").path()
