"""The image role's molecule scenario on the simulated head: check, converge, idempotence
(changed=0), verify (the recorded identity is the image rank 0's Docker really holds)."""

from __future__ import annotations

import pytest
from image_sim import ROOT, run

pytestmark = pytest.mark.sim


def test_molecule_default_scenario(ring_up):
    done = run(["molecule", "test", "-s", "default"], cwd=ROOT / "roles" / "image", timeout=900)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
