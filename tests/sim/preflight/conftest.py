"""Fixtures for preflight on the shared simulated ring (tests/conftest.py's `sim_ring` brings it
up): the inventory's hostvars and a runner for the preflight playbook."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def hostvars(sim_ring: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, dict]:
    """Every rank's hostvars, as the cluster inventory plugin yields them (same code path)."""
    return cluster_hostvars(load_cluster_file(ROOT / "inventories" / "sim" / "cluster.yml"))


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
            # as site.yml runs it (before the model stage): the ring faults are these tests' subject
            "-e",
            "preflight_model_required=false",
            *extra,
        ]
        return sim_ring(argv), reports

    return _run
