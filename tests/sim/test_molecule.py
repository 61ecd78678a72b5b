"""Every role's molecule scenarios (roles/*/molecule/*/), each a `molecule test -s <scenario>` run
from its role directory against the shared simulated ring (docs/sim.md).

The launch role's scenario is run by tests/sim/launch/test_launch_sim.py instead, on the TP4
deployment that module launches anyway: its verify (and the records it must refuse) and its
idempotence step (the same launch again changes nothing). Converging a second TP4 deployment here
would only repeat that launch, minutes of CI's two cores (docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(ROOT.glob("roles/*/molecule/*/molecule.yml"))
ON_THE_LAUNCH_MODULE = {
    "launch:default": "run on the launch module's own TP4 deployment (tests/sim/launch/test_launch_sim.py: "
    "test_the_scenario_verify_holds_the_deployment_to_its_attestation, test_launch_again_changes_nothing)"
}

pytestmark = [
    pytest.mark.sim,
    pytest.mark.extended("every role's molecule scenario on the ring (12 minutes in a clean-clone run here)"),
]


def scenario_param(path: Path) -> pytest.ParameterSet:
    """One scenario as a test parameter (role:scenario), skipped with its reason where another module runs it."""
    name = f"{path.parents[2].name}:{path.parent.name}"
    elsewhere = ON_THE_LAUNCH_MODULE.get(name)
    return pytest.param(path, id=name, marks=[pytest.mark.skip(reason=elsewhere)] if elsewhere else [])


@pytest.mark.parametrize("scenario", [scenario_param(path) for path in SCENARIOS])
def test_molecule_scenario(sim_ring, scenario: Path) -> None:
    role_dir, name = scenario.parents[2], scenario.parent.name
    done = sim_ring(["molecule", "test", "-s", name], cwd=role_dir, timeout=1800)
    assert done.returncode == 0, (
        f"molecule test -s {name} in {role_dir}:\n{done.stdout[-8000:]}\n{done.stderr[-4000:]}"
    )
