"""This machine computes the committed x86 results byte for byte (golden_vectors.py says what they
are); the aarch64 lane (`make arm64`) runs this on an emulated arm64, NEON paths and all."""

from __future__ import annotations

import json
import platform

import numpy as np
import pytest
from golden_vectors import GOLDEN, compute, sha256


@pytest.fixture(scope="module")
def golden() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    index = json.loads((GOLDEN / "index.json").read_text())
    for name, digest in index["files"].items():
        assert sha256(GOLDEN / name) == digest, (
            f"golden/{name} changed: regenerate it on x86 (see golden_vectors.py)"
        )
    with np.load(GOLDEN / "inputs.npz") as inputs, np.load(GOLDEN / "results.npz") as results:
        return dict(inputs), dict(results)


def test_reductions_and_ring_collectives_equal_the_x86_golden_bytes(golden) -> None:
    inputs, want = golden
    got = compute(inputs)
    assert sorted(got) == sorted(want)
    differ = [k for k in want if got[k].tobytes() != want[k].tobytes()]
    assert not differ, f"{platform.machine()} differs from the x86 results in {differ}"
