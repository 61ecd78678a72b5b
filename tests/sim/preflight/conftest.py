"""Fixtures for preflight on the shared simulated ring (tests/conftest.py's `sim_ring` brings it
up): the inventory's hostvars and a runner for the preflight playbook."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def hostvars(sim_ring: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, dict]:
    """Every rank's hostvars, as the cluster inventory plugin yields them."""
    done = sim_ring(["ansible-inventory", "--list"])
    assert done.returncode == 0, done.stderr
    return _plain(json.loads(done.stdout)["_meta"]["hostvars"])


def _plain(value: Any) -> Any:
    """Drop ansible-inventory's {"__ansible_unsafe": ...} wrappers: tests compare plain values."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@pytest.fixture
def run_preflight(
    sim_ring: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> Callable[..., tuple[subprocess.CompletedProcess[str], Path]]:
    """Run playbooks/preflight.yml with its reports in a private folder."""

    def _run(*extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        reports = tmp_path / "preflight"
        argv = [
            "ansible-playbook",
            "playbooks/preflight.yml",
            "-e",
            f"preflight_report_dir={reports}",
            *extra,
        ]
        return sim_ring(argv), reports

    return _run
