"""Fixtures for the image sim tests: the shared ring (never taken down here), a small real image
on rank 0, and a clean slate on the other ranks before each test."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import uuid

import pytest
from image_sim import RANKS, TEST_DEST, docker, docker_import, image_id, rank_path


@pytest.fixture(scope="session")
def ring_up(sim_ring) -> None:
    """The shared simulated ring (tests/conftest.py brings it up; nothing here takes it down)."""
    if shutil.which("zstd") is None:
        pytest.skip("zstd is not installed: run `make apt` (requirements-apt.txt)")


def tiny_image_tar(size: int) -> bytes:
    """A real root filesystem tarball: a few files, one of incompressible data (several chunks)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("etc/sparkring-test", b"fan-out test image\n"), ("data/blob", os.urandom(size))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="session")
def test_image(ring_up) -> str:
    """A small real image imported into rank 0's Docker only; removed from every rank afterwards."""
    ref = f"sparkring/fanout-test:{uuid.uuid4().hex[:12]}"
    done = docker_import("r0", ref, tiny_image_tar(12 * 1024 * 1024))
    assert done.returncode == 0, done.stderr
    yield ref
    for host in RANKS:
        docker(host, "image", "rm", "-f", ref)
        shutil.rmtree(rank_path(host, TEST_DEST), ignore_errors=True)


@pytest.fixture
def clean_ranks(test_image: str) -> str:
    """Ranks 1-3 hold neither the image nor any archive; rank 0 keeps the image, loses archives."""
    for host in RANKS:
        shutil.rmtree(rank_path(host, TEST_DEST), ignore_errors=True)
        if host != "r0":
            docker(host, "image", "rm", "-f", test_image)
            assert image_id(host, test_image) is None
    return test_image
