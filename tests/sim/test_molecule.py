"""Every role's molecule scenarios (roles/*/molecule/*/), each a `molecule test -s <scenario>` run
from its role directory against the shared simulated ring (docs/sim.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(ROOT.glob("roles/*/molecule/*/molecule.yml"))

pytestmark = pytest.mark.sim


@pytest.mark.parametrize(
    "scenario", SCENARIOS, ids=[f"{path.parents[2].name}:{path.parent.name}" for path in SCENARIOS]
)
def test_molecule_scenario(sim_ring, scenario: Path) -> None:
    role_dir, name = scenario.parents[2], scenario.parent.name
    done = sim_ring(["molecule", "test", "-s", name], cwd=role_dir, timeout=1800)
    assert done.returncode == 0, (
        f"molecule test -s {name} in {role_dir}:\n{done.stdout[-8000:]}\n{done.stderr[-4000:]}"
    )
