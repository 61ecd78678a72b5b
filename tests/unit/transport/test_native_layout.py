"""The ctypes mirrors of the C structs are checked against the compiled libraries as they load.

Each library exports its layout (csrc/sr_layout.h); transport/layout.py compares every mirror's
size and field offsets and the constants with it. A scratch copy of the sources with one C field
moved or added is compiled here, and the check refuses it naming the struct and the field.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from transport import _native
from transport.layout import LayoutError, check_layout, exported_layout, layout_problems

CSRC = Path(_native.__file__).resolve().parent / "csrc"
PROGRESS_MIRRORS = {"sr_step_lane": _native.StepLaneC, "sr_step": _native.StepC, "sr_cmd": _native.CmdC}


def test_every_mirror_matches_the_libraries_the_transport_loads() -> None:
    engine, progress = _native.engine(), _native.progress()  # each load runs the check
    engine_layout = exported_layout(engine, "sr_engine_layout")
    assert layout_problems(engine_layout, {"sr_lane": _native.SrLane, "sr_dead": _native.SrDead}, {}) == []
    progress_layout = exported_layout(progress, "sr_progress_layout")
    assert layout_problems(progress_layout, PROGRESS_MIRRORS, {"sr_cmdring": _native.RING_BYTES}) == []
    # the table is the compiler's, not a copy of the mirror: it has every field the C struct has
    assert [k for k in progress_layout if k.startswith("sr_cmd.")][:3] == [
        "sr_cmd.seq",
        "sr_cmd.plan",
        "sr_cmd.op",
    ]


def scratch_progress(tmp_path: Path, edit: tuple[str, str]) -> ctypes.CDLL:
    """libsr_progress built from a copy of csrc/ with one edit to sr_cmdring.h or sr_progress.c."""
    src = tmp_path / "csrc"
    shutil.copytree(CSRC, src)
    old, new = edit
    for name in ("sr_cmdring.h", "sr_progress.c"):
        text = (src / name).read_text()
        if old in text:
            (src / name).write_text(text.replace(old, new, 1))
            break
    else:
        raise AssertionError(f"{old!r} is in neither file: the test's edit is stale")
    lib = tmp_path / "libsr_progress.so"
    cmd = [
        _native.compiler(),
        *_native.CFLAGS,
        "-shared",
        "-I",
        str(src),
        "-o",
        str(lib),
        str(src / "sr_progress.c"),
    ]
    subprocess.run([*cmd, "-lpthread"], check=True, capture_output=True, timeout=300)
    return ctypes.CDLL(str(lib))


def test_a_c_field_moved_in_a_scratch_copy_fails_the_check_naming_it(tmp_path: Path) -> None:
    lib = scratch_progress(
        tmp_path, ("    uint32_t plan;\n    uint32_t op;", "    uint32_t op;\n    uint32_t plan;")
    )
    with pytest.raises(LayoutError) as refused:
        check_layout(lib, "sr_progress_layout", PROGRESS_MIRRORS)
    assert "sr_cmd.plan is at offset 12, CmdC.plan at 8" in str(refused.value)


def test_a_c_field_added_in_a_scratch_copy_fails_on_size_and_count(tmp_path: Path) -> None:
    lib = scratch_progress(
        tmp_path, ("    uint32_t need_in, out_ready, pad;", "    uint32_t need_in, out_ready, pad, extra;")
    )
    with pytest.raises(LayoutError) as refused:
        check_layout(lib, "sr_progress_layout", PROGRESS_MIRRORS)
    assert "sizeof(sr_step) is" in str(refused.value)


def test_the_gpu_producer_mirror_matches_sr_gpu_cu(tmp_path: Path) -> None:
    try:
        flags = _native.gpu_build_flags("sm_90")
    except _native.NativeBuildError as missing:
        pytest.skip(f"no nvcc here ({missing}): the GPU producer's layout is checked where it builds")
    lib = tmp_path / "libsr_gpu.so"
    cmd = [*flags, "-shared", "-I", str(CSRC), "-o", str(lib), str(CSRC / "sr_gpu.cu")]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    check_layout(ctypes.CDLL(str(lib)), "sr_gpu_layout", {"sr_gpu_call": _native.GpuCall})


def test_a_progress_counter_added_in_c_alone_is_refused(tmp_path: Path) -> None:
    """CommandRing.stats() sizes its buffer from PROGRESS_STAT_KEYS: C must agree or it overruns."""
    lib = scratch_progress(
        tmp_path, ("#define SR_STATS (SR_MAX_LABELS + 6)", "#define SR_STATS (SR_MAX_LABELS + 7)")
    )
    stats = _native.MAX_LABELS + len(_native.PROGRESS_STAT_KEYS)
    with pytest.raises(LayoutError) as refused:
        check_layout(lib, "sr_progress_layout", PROGRESS_MIRRORS, {"SR_STATS": stats})
    assert f"SR_STATS is {stats + 1} in C, {stats} in Python" in str(refused.value)
