"""Fixtures for the image tests: the stdlib fan-out code loaded from module_utils, and a loopback ring."""

from __future__ import annotations

import os
import sys

import pytest
from sparkring.module_utils import load_module_utils


@pytest.fixture(scope="session")
def fanout():
    return load_module_utils("sparkring_fanout")


@pytest.fixture(scope="session")
def fanout_manifest(fanout):
    # the manifest module the agent itself imported (by plain name or as ansible.module_utils)
    return sys.modules[fanout.FileSet.__module__]


@pytest.fixture
def archive_bytes() -> bytes:
    return os.urandom(3 * 1024 * 1024 + 12345)
