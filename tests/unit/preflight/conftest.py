"""Import the preflight module and its module_utils the way Ansible resolves them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module

# A folder's conftest named on the command line loads before tests/conftest.py's session start
# exposes module_utils: the fixtures import ansible.module_utils.sparkring_* when they run.
if TYPE_CHECKING:
    from ansible.module_utils.sparkring_docker import Docker


@pytest.fixture(scope="session")
def link_facts() -> ModuleType:
    import ansible.module_utils.sparkring_link_facts as module

    return module


@pytest.fixture(scope="session")
def preflight() -> ModuleType:
    return load_library_module("sparkring_preflight")


@pytest.fixture(scope="session")
def judges() -> ModuleType:
    """Preflight's judgements (module_utils/sparkring_preflight_checks.py)."""
    import ansible.module_utils.sparkring_preflight_checks as module

    return module


# A stand-in for the docker CLI, as tests/unit/modules/test_docker_helper.py uses one: this machine's
# root namespace runs no Docker daemon. It answers the calls preflight makes through the one Docker
# helper: `version` (the daemon answers), `container inspect` from $DOCKER_STATE/<id>.json.
DOCKER_STAND_IN = r"""#!/bin/sh
case "$DOCKER_HOST" in
  *absent*) echo "Cannot connect to the Docker daemon at $DOCKER_HOST. Is the docker daemon running?" >&2
            exit 1;;
esac
case "$1 $2" in
  "version --format") echo 26.1.5; exit 0;;
  "container inspect") if [ -f "$DOCKER_STATE/$3.json" ]; then
                         printf '['; cat "$DOCKER_STATE/$3.json"; printf ']\n'; exit 0
                       fi
                       echo "Error: No such container: $3" >&2; exit 1;;
esac
echo "unexpected docker $*" >&2
exit 2
"""


@pytest.fixture
def docker_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Docker]:
    """`docker_cli(containers, docker_host)`: the Docker helper of a module whose docker CLI is the
    stand-in; `containers` maps an id to the record `docker container inspect` prints for it."""
    from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker

    bin_dir, state = tmp_path / "docker-bin", tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "docker").write_text(DOCKER_STAND_IN)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_STATE", str(state))

    def helper(containers: dict[str, dict] | None = None, docker_host: str = "") -> Docker:
        for cid, record in (containers or {}).items():
            (state / f"{cid}.json").write_text(json.dumps(record))
        with patch_module_args({"docker_host": docker_host}):
            module = AnsibleModule(argument_spec=dict(DOCKER_HOST_OPTION))
        return Docker(module)

    return helper
