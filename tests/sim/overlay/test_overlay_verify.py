"""roles/overlay's molecule verify reads each rank's state: it passes on a converged ring and fails,
naming the rank and what differs, where a package file or the environment file was changed."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "roles" / "overlay" / "molecule" / "default"
SIM_RANKS = Path("/var/lib/sparkring-sim/ranks")
pytestmark = [
    pytest.mark.sim,
    pytest.mark.extended("roles/overlay's molecule verify against drifted ranks, seven playbook runs"),
]


def test_verify_fails_on_the_ranks_whose_overlay_drifted(sim_ring) -> None:
    def playbook(name: str):
        return sim_ring(["ansible-playbook", str(SCENARIO / name)], timeout=600)

    converged = playbook("converge.yml")
    assert converged.returncode == 0, converged.stdout[-4000:]
    passed = playbook("verify.yml")
    assert passed.returncode == 0, passed.stdout[-4000:]
    package = SIM_RANKS / "r1" / "opt-sparkring" / "python" / "overlay" / "ring.py"
    env_file = SIM_RANKS / "r2" / "etc-sparkring" / "overlay.env"
    try:
        package.write_text(package.read_text() + "# drift\n")
        env_file.write_text(
            env_file.read_text().replace("SPARKRING_TRANSPORT_PORT=18600", "SPARKRING_TRANSPORT_PORT=18601")
        )
        failed = playbook("verify.yml")
    finally:
        restored = playbook("converge.yml")
    assert failed.returncode != 0
    assert "/opt/sparkring/python/overlay on r1 differs from" in failed.stdout and "ring.py" in failed.stdout
    assert "/etc/sparkring/overlay.env on r2 holds" in failed.stdout and "18601" in failed.stdout
    assert sorted(line.split()[0] for line in failed.stdout.splitlines() if "failed=1" in line) == [
        "r1",
        "r2",
    ]
    assert restored.returncode == 0, restored.stdout[-4000:]
    assert playbook("verify.yml").returncode == 0
