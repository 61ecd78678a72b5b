"""Every lane's session setup, and the sim lane's fixtures: project commands, the shared ring.

At session start, module_utils/ and roles/*/module_utils/ join `ansible.module_utils.__path__`
(tests/project_code.py), before any test module imports `ansible.module_utils.sparkring_*`.

The simulated ring (playbooks/sim.yml) is one set of hosts for the whole session: brought up
once when it is not up, and left up for every later test (`make sim-down` or .ci/run removes it).
The ring's own lifecycle test (tests/sim/sim_ring/test_lifecycle.py) takes the ring down and up
to compare the machine before and after; it is moved to the front of the session so that it
runs before any other test has put state on the ranks.

Tests marked `extended` (their marker says what they run and what it costs) skip in `make test`,
saying so, and run in `make test-extended` (SPARKRING_EXTENDED_TESTS=1): `make test` must finish
within CI's 90 minutes on two cores (docs/testing.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.project_code import expose_module_utils

ROOT = Path(__file__).resolve().parents[1]
LIFECYCLE_TESTS = "tests/sim/sim_ring/test_lifecycle.py"
SIM_TOOLS = ("ip", "tc", "nsenter", "unshare", "sshd", "dockerd", "docker", "nc", "ssh-keygen")

Runner = Callable[..., subprocess.CompletedProcess[str]]
EXTENDED = os.environ.get("SPARKRING_EXTENDED_TESTS") == "1"

# module_utils where Ansible finds them, as this file loads: before any folder's conftest or test
# module imports `ansible.module_utils.sparkring_*` (no Ansible, as on the device lane: nothing to do).
if importlib.util.find_spec("ansible") is not None:
    expose_module_utils()


def project_env() -> dict[str, str]:
    """The environment `make` gives its commands: the venv first on PATH, the project's ansible.cfg."""
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("ANSIBLE_INVENTORY", None)
    return env


def run_project(argv: list[str], timeout: int = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a command from the project root with the project's environment (output captured)."""
    return subprocess.run(
        argv, cwd=cwd, env=project_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def sim_ring_is_up() -> bool:
    """Every rank answers Ansible over ssh, as the inventory says."""
    return run_project(["ansible", "sparkring", "-m", "ansible.builtin.ping"], timeout=120).returncode == 0


def require_sim_host() -> None:
    """Skip (with the reason) where the simulated ring cannot exist."""
    if os.geteuid() != 0:
        pytest.skip("the simulated ring needs root (network namespaces, sshd, dockerd)")
    missing = [
        tool
        for tool in SIM_TOOLS
        if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None
    ]
    if missing:
        pytest.skip(f"the simulated ring needs {', '.join(missing)}: run `make apt` (requirements-apt.txt)")


def extended_skip(marker: pytest.Mark) -> pytest.MarkDecorator:
    """The skip an `extended` test gets outside `make test-extended`: what it runs, and why not here."""
    return pytest.mark.skip(
        reason=f"{marker.args[0]}: opt-in, `make test-extended` (SPARKRING_EXTENDED_TESTS=1); "
        "make test leaves it out to finish within CI's 90 minutes on two cores (docs/testing.md)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ring's lifecycle test first: it compares the machine without the ring to after sim-down.
    Outside `make test-extended`, every `extended` test skips, naming what it would have run."""
    first = [item for item in items if item.nodeid.startswith(LIFECYCLE_TESTS)]
    if first:
        items[:] = first + [item for item in items if not item.nodeid.startswith(LIFECYCLE_TESTS)]
    if not EXTENDED:
        for item in items:
            if (marker := item.get_closest_marker("extended")) is not None:
                item.add_marker(extended_skip(marker))


class SimHost:
    """This machine as the sim lane uses it: project commands, and whether the ring answers."""

    root = ROOT
    run = staticmethod(run_project)
    ring_is_up = staticmethod(sim_ring_is_up)


@pytest.fixture(scope="session")
def sim_host() -> SimHost:
    """This machine, when it can hold the simulated ring (root, the tools); skips otherwise."""
    require_sim_host()
    return SimHost()


@pytest.fixture(scope="session")
def sim_ring(sim_host: SimHost) -> Runner:
    """The shared simulated ring, up (brought up by playbooks/sim.yml when it is not)."""
    if not sim_host.ring_is_up():
        done = run_project(["ansible-playbook", "playbooks/sim.yml"])
        assert done.returncode == 0, (
            f"playbooks/sim.yml failed:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        )
    return run_project
