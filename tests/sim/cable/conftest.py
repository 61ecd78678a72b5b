"""Fixtures for cable qualification on the simulated ring: the ring up (shared, never taken
down here), the transport built on every rank once, and a runner for the qualify playbook."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

# Few round trips keep the runs short; the sim's veths need no more to tell a fault apart. The
# burn after the probes too: every collective at every size still runs, with fewer calls.
ITERATIONS = "100"
BURN_ITERATIONS = "[20, 1]"


@pytest.fixture(scope="session")
def transport_built(sim_ring: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """playbooks/build.yml once: the probe needs the transport on every rank."""
    done = sim_ring(["ansible-playbook", "playbooks/build.yml"])
    assert done.returncode == 0, f"playbooks/build.yml failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"


@pytest.fixture
def run_qualify(
    sim_ring: Callable[..., subprocess.CompletedProcess[str]], transport_built: None, tmp_path: Path
) -> Callable[..., tuple[subprocess.CompletedProcess[str], dict]]:
    """Run playbooks/qualify.yml (the build already done) with its report in a private folder."""

    def _run(*extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
        reports = tmp_path / "qualify"
        done = sim_ring(
            [
                "ansible-playbook",
                "playbooks/qualify.yml",
                "--skip-tags",
                "transport_build",
                "-e",
                f"qualify_report_dir={reports}",
                "-e",
                f"qualify_iterations={ITERATIONS}",
                "-e",
                f'{{"qualify_burn_iterations": {BURN_ITERATIONS}}}',
                *extra,
            ]
        )
        report_file = reports / "qualify.json"
        assert report_file.exists(), f"no report:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        assert (reports / "qualify.txt").read_text().startswith("qualify sim: ")
        return done, json.loads(report_file.read_text())

    return _run


@pytest.fixture
def run_burn(
    sim_ring: Callable[..., subprocess.CompletedProcess[str]], transport_built: None, tmp_path: Path
) -> Callable[..., tuple[subprocess.CompletedProcess[str], dict]]:
    """Run playbooks/burn.yml (the four-rank burn gate alone) with its report in a private folder."""

    def _run(*extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
        reports = tmp_path / "burn"
        done = sim_ring(
            ["ansible-playbook", "playbooks/burn.yml", "-e", f"qualify_report_dir={reports}", *extra]
        )
        report_file = reports / "burn.json"
        assert report_file.exists(), f"no report:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        return done, json.loads(report_file.read_text())

    return _run
