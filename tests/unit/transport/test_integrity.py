"""transport/integrity.py: one sha256 of files and trees, atomic JSON, secret names; its node copy."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sparkring import lock

from transport import integrity

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "module_utils"))
import sparkring_attest  # noqa: E402


def test_the_module_utils_copy_is_the_same_file() -> None:
    """Modules carry module_utils/sparkring_integrity.py to the nodes and into the images."""
    source = (ROOT / "transport" / "integrity.py").read_bytes()
    copy = (ROOT / "module_utils" / "sparkring_integrity.py").read_bytes()
    assert copy == source, "run: cp transport/integrity.py module_utils/sparkring_integrity.py"


def package(tmp_path: Path) -> Path:
    top = tmp_path / "pkg"
    (top / "sub" / "__pycache__").mkdir(parents=True)
    (top / "__init__.py").write_text('"""pkg"""\n')
    (top / "sub" / "data.bin").write_bytes(bytes(range(256)) * 5000)
    (top / "sub" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"bytecode")
    (top / "stale.pyc").write_bytes(b"bytecode")
    return top


def test_file_and_tree_hashes(tmp_path: Path) -> None:
    top = package(tmp_path)
    data = top / "sub" / "data.bin"
    assert integrity.sha256_file(data) == hashlib.sha256(data.read_bytes()).hexdigest()
    names = integrity.package_files(top)
    assert names == ["__init__.py", "sub/data.bin"]
    lines = "".join(f"{n}\0{hashlib.sha256((top / n).read_bytes()).hexdigest()}\n" for n in names)
    assert integrity.tree_sha256(top, names) == hashlib.sha256(lines.encode()).hexdigest()
    assert integrity.tree_sha256(top, reversed(names)) == integrity.tree_sha256(top, names)


def test_the_lock_and_the_image_probe_hash_a_tree_alike(tmp_path: Path) -> None:
    """The lock's source-tree hash and the launch's in-image probe are the same function."""
    top = package(tmp_path)
    (top / "stale.pyc").unlink()
    (top / "sub" / "__pycache__" / "x.cpython-311.pyc").unlink()
    expected = integrity.tree_sha256(top, integrity.package_files(top))
    assert lock.tree_sha256("pkg", root=tmp_path) == expected
    nccl = tmp_path / "libnccl.so.2"
    nccl.write_bytes(b"\x7fELF")
    # As in the image: the probe runs with the integrity copy's folder as its working directory.
    done = subprocess.run(
        [sys.executable, "-c", sparkring_attest.IMAGE_PROBE, str(nccl), "pkg", "absent_pkg"],
        cwd=ROOT / "module_utils",
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    probe = json.loads(done.stdout)
    assert probe["packages"]["pkg"] == {"path": str(top), "sha256": expected}
    assert probe["packages"]["absent_pkg"] == {"path": None, "sha256": None}
    assert probe["nccl"]["sha256"] == integrity.sha256_file(nccl)


def test_write_json_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    integrity.write_json_atomic(target, {"b": 1, "a": [1, 2]})
    assert target.read_text() == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'
    with pytest.raises(TypeError):
        integrity.write_json_atomic(target, {"unserialisable": object()})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left behind


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "VLLM_API_KEY",
        "api_key",
        "apiKey",
        "api-key",
        "private_key",
        "password",
        "DB_PASSWD",
        "passphrase",
        "AWS_SECRET_ACCESS_KEY",
        "GIT_CREDENTIALS",
        "x_secret",
    ],
)
def test_secret_names(name: str) -> None:
    assert integrity.is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["private_key_file", "known_hosts_file", "MASTER_ADDR", "gid_index", "VLLM_HOST_IP", "keyboard"]
)
def test_names_that_are_not_secret(name: str) -> None:
    assert not integrity.is_secret_name(name)


def test_redact_env_keeps_names_and_hides_values() -> None:
    env = integrity.redact_env({"HF_TOKEN": "hf_x", "GIT_CREDENTIALS": "c", "MASTER_ADDR": "1.2.3.4"})
    assert env == {
        "GIT_CREDENTIALS": integrity.REDACTED,
        "HF_TOKEN": integrity.REDACTED,
        "MASTER_ADDR": "1.2.3.4",
    }
