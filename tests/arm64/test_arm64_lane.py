"""What the aarch64 lane proves beyond the unit tests it runs (tests/arm64/run.sh): that it runs
on aarch64, that the project's build code refuses a warning there, and that the engine it built
carries the NEON adds. Outside the lane's root these skip."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from transport import _native

pytestmark = pytest.mark.skipif(
    os.environ.get("SPARKRING_ARM64_LANE") != "1", reason="runs in the arm64 lane's root only (make arm64)"
)


def test_the_lane_runs_on_aarch64() -> None:
    assert platform.machine() == "aarch64"


def test_the_build_code_builds_the_engine_and_the_progress_thread_for_aarch64() -> None:
    # The progress thread's own tests need torch, which the root lacks: build it here at least.
    em_aarch64 = 183
    for lib in (_native.ENGINE, _native.PROGRESS):
        header = lib.build().read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == em_aarch64, lib.name


def test_the_build_code_fails_on_a_warning(tmp_path: Path) -> None:
    assert "-Werror" in _native.CFLAGS
    source = tmp_path / "warns.c"
    source.write_text("int sr_warns(void) { int unused; return 0; }\n")
    with pytest.raises(
        _native.NativeBuildError, match=r"unused variable .unused. \[-Werror=unused-variable\]"
    ):
        _native.compile_cached("libwarns.so", [source], [])


def test_the_engine_carries_the_neon_adds() -> None:
    # FCVTL/FCVTN: the fp16 widen and narrow of sr_add_f16_neon; FADD on four lanes: sr_add4.
    text = subprocess.run(
        ["objdump", "-d", str(_native.ENGINE.build())], capture_output=True, text=True, check=True
    ).stdout
    for instruction in ("fcvtl", "fcvtn", "fadd\tv"):
        assert instruction in text, instruction
