"""Import the shared ring-port checks and link facts the way Ansible resolves module_utils."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def checks() -> ModuleType:
    import ansible.module_utils.sparkring_ring_checks as module

    return module


@pytest.fixture(scope="session")
def link_facts() -> ModuleType:
    import ansible.module_utils.sparkring_link_facts as module

    return module
