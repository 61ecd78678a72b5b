"""Fixtures for the image tests: the stdlib fan-out code loaded from module_utils, and a loopback ring."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_module_utils(name: str):
    """Import a module_utils file the way a node sees it: a plain stdlib module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "module_utils" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fanout():
    load_module_utils("sparkring_geometry")  # what the fan-out imports, as a script would find them
    load_module_utils("sparkring_integrity")
    return load_module_utils("sparkring_fanout")


@pytest.fixture
def archive_bytes() -> bytes:
    return os.urandom(3 * 1024 * 1024 + 12345)
