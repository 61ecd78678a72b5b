"""Import the shared ring-port checks and link facts the way Ansible resolves module_utils."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest

ROOT = Path(__file__).resolve().parents[3]

# Ansible finds project module_utils as ansible.module_utils.<name>; so do these tests.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


@pytest.fixture(scope="session")
def checks() -> ModuleType:
    import ansible.module_utils.sparkring_ring_checks as module

    return module


@pytest.fixture(scope="session")
def link_facts() -> ModuleType:
    import ansible.module_utils.sparkring_link_facts as module

    return module
