"""Fixtures for the NCCL build tests: the module loaded as Ansible loads it, the fixture source,
and the real NCCL 2.29.7 source fetched once into the cache outside the repository."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module

ROOT = Path(__file__).resolve().parents[3]
REAL_VERSION = "2.29.7-1"


def nvcc_or_skip() -> str:
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )
    if nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc) on this machine: the NCCL build needs it")
    return nvcc


@pytest.fixture(scope="session")
def nvcc() -> str:
    return nvcc_or_skip()


@pytest.fixture(scope="session")
def nccl_utils() -> ModuleType:
    import ansible.module_utils.sparkring_nccl as module

    return module


@pytest.fixture(scope="session")
def build_module() -> ModuleType:
    return load_library_module("sparkring_nccl_build")


@pytest.fixture(scope="session")
def fetcher() -> ModuleType:
    import images.nccl.fetch_source as module

    return module


@pytest.fixture(scope="session")
def fixture_lib() -> ModuleType:
    import fixture_source as module

    return module


@pytest.fixture
def fixture_source(fixture_lib, tmp_path) -> dict:
    """The fixture archive + patch, as module arguments (dest and work_dir under tmp_path)."""
    fixture = fixture_lib
    lock = fixture.make_fixture(tmp_path / "inputs")
    release = lock["nccl"]["releases"][fixture.VERSION]
    return {
        "version": fixture.VERSION,
        "source_archive": release["source_url"].removeprefix("file://"),
        "source_sha256": release["source_sha256"],
        "source_dir": release["source_dir"],
        "patches": [{"path": p["file"], "sha256": p["sha256"]} for p in release["patches"]],
        "dest": str(tmp_path / "opt" / "nccl"),
        "work_dir": str(tmp_path / "work"),
    }


@pytest.fixture
def without_cuda(tmp_path) -> dict:
    """Module arguments that point cuda_home at a directory with no nvcc: a refusal must not need one."""
    return {"cuda_home": str(tmp_path / "no-cuda-toolkit")}


@pytest.fixture
def run_module(build_module, capsys):
    """Run the module in-process as Ansible would; returns its JSON result. Tests that build (or
    plan one, which asks nvcc its release) take the `nvcc` fixture; refusals run everywhere."""

    def run(args: dict, check: bool = False, diff: bool = False) -> dict:
        with (
            patch_module_args(args | {"_ansible_check_mode": check, "_ansible_diff": diff}),
            pytest.raises(SystemExit),
        ):
            build_module.main()
        return json.loads(capsys.readouterr().out)

    return run


@pytest.fixture(scope="session")
def real_source(fetcher) -> Path:
    """NCCL 2.29.7's pinned archive, fetched once into the cache outside the repository
    (/var/cache/sparkring-nccl, or $SPARKRING_NCCL_CACHE)."""
    try:
        return Path(fetcher.fetch(REAL_VERSION)["path"])
    except fetcher.SourceUnreachable as error:
        pytest.skip(f"cannot reach the NCCL {REAL_VERSION} source from here: {error}")
    except PermissionError as error:
        pytest.skip(f"cannot write the source cache (root, or set SPARKRING_NCCL_CACHE): {error}")
