"""Fixtures for the image tests: the stdlib fan-out code loaded from module_utils, and a loopback ring."""

from __future__ import annotations

import os

import pytest
from sparkring.module_utils import load_module_utils


@pytest.fixture(scope="session")
def fanout():
    # what the fan-out imports by name first, as a script beside them would find them
    return load_module_utils("sparkring_geometry", "sparkring_integrity", "sparkring_fanout")


@pytest.fixture
def archive_bytes() -> bytes:
    return os.urandom(3 * 1024 * 1024 + 12345)
