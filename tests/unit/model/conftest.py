"""Fixtures for the model stage's module tests: real files, real sockets on loopback, a small
multi-file checkpoint as rank 0's source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from model_harness import CHUNK, finish, start


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """Rank 0's source directory: two shards in a subdirectory, a config, an empty file."""
    source = tmp_path / "source"
    (source / "weights").mkdir(parents=True)
    (source / "config.json").write_text('{"layers": 2}\n')
    (source / "weights" / "model-00001-of-00002.safetensors").write_bytes(os.urandom(5 * CHUNK + 123))
    (source / "weights" / "model-00002-of-00002.safetensors").write_bytes(os.urandom(3 * CHUNK))
    (source / "empty.txt").write_bytes(b"")
    return source


@pytest.fixture
def run_model(tmp_path: Path):
    """Run the module once (check/diff flags as Ansible passes them); returns its result."""

    def run(args: dict, check: bool = False, diff: bool = False) -> dict:
        return finish(start(args, tmp_path, check, diff))

    return run
