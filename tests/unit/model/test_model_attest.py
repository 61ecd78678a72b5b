"""The launch attestation of a model mount (library/sparkring_rank_launch.py): the digest the model
stage verified, or a refusal naming the files; on real files with the model stage's own record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible.module_utils import sparkring_fanout as fanout
from ansible.module_utils import sparkring_model as model
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_integrity import sha256_file
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module


@pytest.fixture
def staged(tmp_path: Path) -> dict:
    """A model directory as the model stage leaves it, and its pin as the launch receives it."""
    top = tmp_path / "models" / "tiny"
    top.mkdir(parents=True)
    (top / "config.json").write_text('{"layers": 2}\n')
    (top / "model.safetensors").write_bytes(os.urandom(100_000))
    files = [
        {"path": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(top.iterdir())
    ]
    manifests = [fanout.build_manifest(str(top / f["path"]), 1 << 16).to_dict() for f in files]
    model.write_record(model.layout(str(top)), {"name": "tiny", "revision": "tiny-v1"}, manifests)
    return {"name": "tiny", "revision": "tiny-v1", "path": str(top), "files": files}


def attest_mount(pin: dict, tmp_path: Path, source: str) -> str:
    """RankLauncher.mounts on one rank (rank 2) for one read-only mount source: its digest."""
    mount = {"source": source, "target": "/models/tiny", "read_only": True}
    args = {
        "spec": {"container_name": "sparkring-rank2", "rank": 2, "mounts": [mount]},
        "models": [pin],
        "docker_host": "",
        "state_dir": str(tmp_path / "launch"),
    }
    with patch_module_args(args):
        module = AnsibleModule(
            argument_spec={
                "spec": {"type": "dict"},
                "models": {"type": "list", "elements": "dict"},
                "docker_host": {"type": "str"},
                "state_dir": {"type": "path"},
            }
        )
        launch = load_library_module("sparkring_rank_launch")
        return launch.RankLauncher(module).mounts()[0]["manifest_sha256"]


def test_a_model_mount_attests_the_digest_the_model_stage_verified(staged, tmp_path):
    assert attest_mount(staged, tmp_path, staged["path"]) == model.pinned_digest(staged["files"])


def test_a_model_directory_with_a_stray_file_or_a_changed_file_is_refused(staged, tmp_path, capsys):
    Path(staged["path"], "stray.json").write_text("{}\n")
    with pytest.raises(SystemExit):
        attest_mount(staged, tmp_path, staged["path"])
    refused = json.loads(capsys.readouterr().out)
    assert refused["failed"]
    assert (
        f"mounts: {staged['path']} on rank 2 is not the verified tiny tiny-v1 (stray.json: not in the manifest)"
        in (refused["msg"])
    )
    os.unlink(Path(staged["path"], "stray.json"))
    with open(Path(staged["path"], "config.json"), "a") as handle:
        handle.write(" ")
    with pytest.raises(SystemExit):
        attest_mount(staged, tmp_path, staged["path"])
    assert "config.json: changed since it was verified" in json.loads(capsys.readouterr().out)["msg"]


def test_a_read_only_directory_no_pin_describes_is_refused(staged, tmp_path, capsys):
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(SystemExit):
        attest_mount(staged, tmp_path, str(other))
    assert "that no pinned model describes" in json.loads(capsys.readouterr().out)["msg"]
