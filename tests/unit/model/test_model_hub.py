"""The model stage's hub path: the real huggingface_hub client against the real hub, at a pinned
commit, through the module as rank 0 runs it. Where no hub is reachable (this project's machines
reach only PyPI and Debian) it skips saying so; the source-directory path carries the sim."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from model_harness import pinned_files

HUB = "huggingface.co"
# A small public repository the hub's own client tests use; two of its files are enough.
REPOSITORY = "hf-internal-testing/tiny-random-gpt2"
FILES = ("config.json", "vocab.json")


def hub_unreachable() -> str | None:
    try:
        socket.create_connection((HUB, 443), timeout=5).close()
    except OSError as error:
        return (
            f"{HUB}:443 is unreachable from this machine ({error}): the hub path cannot run here; "
            "the source-directory path carries the sim"
        )
    return None


@pytest.fixture
def hub(tmp_path: Path):
    reason = hub_unreachable()
    if reason:
        pytest.skip(reason)
    return pytest.importorskip(
        "huggingface_hub",
        reason="huggingface_hub is not installed here (the model role installs it on rank 0)",
    )


def test_rank0_obtains_a_pinned_commit_from_the_hub(hub, run_model, tmp_path):
    commit = hub.HfApi().model_info(REPOSITORY).sha
    reference = tmp_path / "reference"
    for name in FILES:  # the pin, from an independent download of the same commit
        hub.hf_hub_download(REPOSITORY, name, revision=commit, local_dir=reference)
    files = [f for f in pinned_files(reference) if f["path"] in FILES]
    target = tmp_path / "r0" / "models" / "tiny-gpt2"
    args = {
        "name": "tiny-gpt2",
        "revision": commit,
        "path": str(target),
        "files": files,
        "source": "hub",
        "repository": REPOSITORY,
        "state": "obtained",
        "rank": 0,
        "reserve_bytes": 0,
    }

    done = run_model(args)
    assert done["changed"] and not done.get("failed"), done
    for pin in files:
        assert hashlib.sha256((target / pin["path"]).read_bytes()).hexdigest() == pin["sha256"]
    assert sorted(p.name for p in target.iterdir()) == sorted(FILES)  # the client's own files stay outside

    other = tmp_path / "r0" / "models" / "other"
    wrong = [dict(files[0], sha256="0" * 64), *files[1:]]
    refused = run_model(args | {"path": str(other), "files": wrong})
    assert refused.get("failed") and "does not hold the pinned revision" in refused["msg"]
    assert not other.exists()
