"""Fixtures for the model stage's sim tests: the shared ring (never taken down here), the sim's
tiny model as rank 0's source, and a clean test directory on every rank before each test."""

from __future__ import annotations

import pytest
from model_sim import SIM_MODEL, Stage, clean_ranks


@pytest.fixture(scope="session")
def model_ring(sim_ring):
    """The shared ring's runner (project environment, bounded), once the sim model exists."""
    if not (SIM_MODEL / "config.json").is_file():
        pytest.skip("the tiny model is missing: run `make sim-model`")
    return sim_ring


@pytest.fixture(scope="session")
def stage(model_ring, tmp_path_factory) -> Stage:
    """The sim model as the target and a small multi-shard checkpoint as the draft (3 x 6 MiB),
    generated once per session."""
    return Stage(tmp_path_factory.mktemp("model-stage"), draft_mib=18, shards=3)


@pytest.fixture
def clean(stage: Stage) -> Stage:
    clean_ranks()
    yield stage
    clean_ranks()
