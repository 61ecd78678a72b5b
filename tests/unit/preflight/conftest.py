"""Import the preflight module and its module_utils the way Ansible resolves them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest

ROOT = Path(__file__).resolve().parents[3]

# Ansible finds project module_utils as ansible.module_utils.<name>; so do these tests.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))


def _load_library(name: str) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "library" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def link_facts() -> ModuleType:
    import ansible.module_utils.sparkring_link_facts as module

    return module


@pytest.fixture(scope="session")
def preflight() -> ModuleType:
    return _load_library("sparkring_preflight")
