"""A flavor whose wheels the lock pins is built only from exactly those wheels.

The build context (images/build_context.py) refuses a set the lock does not hold complete, and a
wheelhouse with an unpinned, swapped or missing wheel, naming it; the requirements file it writes
is what the Containerfile installs with `pip install --require-hashes --no-index`, which these
tests run for real on tiny wheels built here (pip refuses a swapped wheel a second time)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from sparkring import lock

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "images"))
import build_context  # noqa: E402


def make_wheel(folder: Path, name: str, version: str, body: str = "") -> Path:
    """A minimal valid pure-Python wheel of `name` `version` (pip installs it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}_tiny/__init__.py": f"VERSION = {version!r}\n{body}",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: sparkring-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            data = text.encode()
            wheel.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        wheel.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def locked(path: Path, name: str, version: str) -> dict:
    return {
        "name": name,
        "version": version,
        "file": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build context folder whose wheelhouse holds exactly a complete tiny upstream set, and the
    lock the build context reads, pinning that set."""
    if lock.stale_trees(lock.load_lock()):
        pytest.skip("lock is stale: test_lock_is_current_with_the_sources says how to refresh it")
    wheels = tmp_path / "context" / "wheels"
    pinned = [locked(make_wheel(wheels, "vllm", "0.32.0"), "vllm", "0.32.0")]
    pinned.append(locked(make_wheel(wheels, "torch", "2.13.0"), "torch", "2.13.0"))
    data = lock.load_lock().model_dump(mode="json")
    data["wheels"]["upstream"] |= {
        "complete": True,
        "wheels": pinned,
        "requirements": ["vllm==0.32.0", "torch==2.13.0"],
    }
    tiny = lock.Lock.model_validate(data)
    monkeypatch.setattr(build_context, "load_lock", lambda: tiny)
    (tmp_path / "libnccl.so.2").write_bytes(b"\x7fELF patched nccl")
    return tmp_path / "context"


def assemble(context: Path, dry_run: bool = False) -> dict:
    return build_context.assemble("upstream", context, context.parent / "libnccl.so.2", dry_run=dry_run)


def pip_install(context: Path) -> subprocess.CompletedProcess:
    """What the upstream Containerfile runs, into a folder instead of the image's venv; like the image
    build, with no pip configuration (this machine's adds a find-links folder of its own wheels)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--require-hashes",
            "--no-deps",
            "--no-cache-dir",
            "--find-links",
            str(context / "wheels"),
            "--target",
            str(context.parent / "installed"),
            "-r",
            str(context / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_the_committed_upstream_set_is_not_complete_and_the_build_says_how_to_resolve_it(
    tmp_path: Path,
) -> None:
    if lock.stale_trees(lock.load_lock()):
        pytest.skip("lock is stale: test_lock_is_current_with_the_sources says how to refresh it")
    (tmp_path / "libnccl.so.2").write_bytes(b"\x7fELF")
    with pytest.raises(SystemExit) as refused:
        build_context.assemble("upstream", tmp_path / "context", tmp_path / "libnccl.so.2", dry_run=True)
    message = str(refused.value)
    assert "images/lock.json wheels.upstream is not complete (it holds torch 2.13.0, vllm 0.32.0," in message
    assert "playbooks/wheel-lock.yml --check --diff" in message


def test_the_exact_wheelhouse_builds_and_installs_with_require_hashes(context: Path) -> None:
    result = assemble(context)
    assert result["tag"].startswith("sparkring/runtime:upstream-")
    requirements = (context / "requirements.txt").read_text()
    for wheel in build_context.load_lock().wheels["upstream"].wheels:
        assert f"{wheel.name}=={wheel.version} --hash=sha256:{wheel.sha256}\n" in requirements
    assert (context / "Containerfile").read_bytes() == (ROOT / "images/upstream/Containerfile").read_bytes()
    installed = pip_install(context)
    assert installed.returncode == 0, installed.stderr
    assert (context.parent / "installed" / "vllm_tiny" / "__init__.py").is_file()
    assert assemble(context) == {**result, "changed": False}  # nothing moves on a rerun


def test_an_unpinned_wheel_in_the_wheelhouse_is_refused_naming_it(context: Path) -> None:
    extra = make_wheel(context / "wheels", "sneaky", "1.0")
    for dry_run in (True, False):
        with pytest.raises(SystemExit, match=f"{extra}: unpinned, not in the lock's wheel set; remove it"):
            assemble(context, dry_run)


def test_a_swapped_wheel_is_refused_by_the_build_and_by_pip(context: Path) -> None:
    pinned = build_context.load_lock().wheels["upstream"].wheel("torch").sha256
    assemble(context)  # the context and its requirements file, from the exact wheelhouse
    swapped = make_wheel(context / "wheels", "torch", "2.13.0", body="EVIL = True\n")
    actual = hashlib.sha256(swapped.read_bytes()).hexdigest()
    with pytest.raises(SystemExit, match=f"{swapped}: swapped, sha256 {actual}, the lock pins {pinned}"):
        assemble(context)
    installed = pip_install(context)  # the install in the image checks the hashes again
    assert installed.returncode != 0 and "DO NOT MATCH THE HASHES" in installed.stderr
    assert not (context.parent / "installed" / "torch_tiny").exists()


def test_a_missing_wheel_is_named_when_the_plan_is_made(context: Path) -> None:
    (context / "wheels" / "vllm-0.32.0-py3-none-any.whl").unlink()
    with pytest.raises(
        SystemExit, match=r"wheels/vllm-0\.32\.0-py3-none-any\.whl: missing \(the lock pins it\)"
    ):
        assemble(context, dry_run=True)
