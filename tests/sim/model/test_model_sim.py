"""The model stage on the simulated ring: the sim's tiny model and a multi-shard checkpoint from
rank 0's source directories to every rank over the veth ring links, verified, then changed=0;
and the faults the issue names, each leaving the directory the launch mounts untouched or complete."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from ansible.module_utils import sparkring_model
from model_sim import (
    DRAFT,
    RANKS,
    ROOT,
    TARGET,
    Stage,
    clean_ranks,
    holds,
    progress,
    project_env,
    rank_path,
    recap,
    record,
)

pytestmark = [
    pytest.mark.sim,
    pytest.mark.extended("the model stage's faults on the ring, each with its own model.yml runs"),
]

SHARD = "model-00002-of-00003.safetensors"


def everywhere(stage) -> None:
    for host in RANKS:
        assert holds(host, TARGET, stage.target_files), host
        assert holds(host, DRAFT, stage.draft_files), host


def flip_a_byte(path, offset: int) -> None:
    """Flip one bit in place and put the mtime back, as silent corruption would."""
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_every_rank_gets_the_pinned_files_then_repairs_what_breaks(clean, model_ring):
    """Placement and changed=0, then two faults in one rerun: a shard truncated on rank 2 (resumed)
    and a flipped byte in rank 3's copy (never mounted, re-sent; corrupted once more on the way)."""
    stage = clean
    planned = model_ring(stage.argv(check=True))
    assert planned.returncode == 0, planned.stdout[-5000:]
    flat = " ".join(planned.stdout.split())
    draft_bytes = sum(f["size"] for f in stage.draft_files)
    for rank in (1, 2, 3):  # --check --diff: per rank, the files and bytes that would move
        assert (
            f"rank {rank}: sim-bulk {stage.draft_revision} at {DRAFT}: lacks 6 of 6 files, {draft_bytes} bytes"
            in flat
        )
    shard_size = next(f["size"] for f in stage.draft_files if f["path"] == SHARD)
    assert f"{SHARD} {shard_size} (moves {shard_size} bytes)" in planned.stdout
    assert not any(rank_path(host, TARGET).parent.exists() for host in RANKS)  # check mode moved nothing

    done = model_ring(stage.argv())
    assert done.returncode == 0, done.stdout[-6000:]
    everywhere(stage)
    digests = {record(host, DRAFT)["manifest_sha256"] for host in RANKS}
    assert digests == {sparkring_model.pinned_digest(stage.draft_files)}
    for host in RANKS[1:]:
        assert progress(host, DRAFT)["received_bytes"] == draft_bytes, host
    # progress: one header per model's wait, one line per rank per interval (and a final one)
    assert done.stdout.count("TASK [model : Follow the transfer") == 2
    for rank in (1, 2, 3):
        assert re.search(rf"^r{rank} \| rank {rank}: .*chunks verified", done.stdout, flags=re.M), rank

    again = model_ring(stage.argv())
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.stdout[-3000:]
    assert "holds every pinned file, moves nothing" in " ".join(again.stdout.split())

    mib = 1 << 20
    truncated = rank_path("r2", DRAFT) / SHARD
    os.truncate(truncated, 2 * mib + 5)  # two whole 1 MiB chunks survive
    flipped = rank_path("r3", DRAFT) / SHARD
    flip_a_byte(flipped, mib + 17)  # inside chunk 1 of the shard
    # what the launch attestation and the preflight read: rank 3's copy is not the verified one
    digest, problems = sparkring_model.record_problems(
        sparkring_model.layout(str(rank_path("r3", DRAFT))), stage.draft_files
    )
    assert digest is None and problems == [f"{SHARD}: changed since it was verified (size, mtime or ctime)"]
    # rank 0 (which feeds rank 3 directly) corrupts the re-sent chunk once on the way
    index = sum(-(-f["size"] // mib) for f in stage.draft_files if f["path"] < SHARD) + 1
    repaired = model_ring(stage.argv("-e", json.dumps({"fault_corrupt": {"r0": [index]}})))
    assert repaired.returncode == 0, repaired.stdout[-6000:]
    r2, r3 = progress("r2", DRAFT), progress("r3", DRAFT)
    assert r2["resumed_chunks"] == 2 and r2["received_bytes"] == shard_size - 2 * mib
    assert r3["rejected_chunks"] == 1 and r3["received_bytes"] == mib
    everywhere(stage)


def test_a_relay_killed_mid_file_resumes(clean, model_ring):
    stage = clean
    # paced to ~2 MB/s per link, so the 18 MiB draft takes several seconds to cross
    proc = subprocess.Popen(
        stage.argv("-e", "model_max_rate_mbit=16"),
        cwd=ROOT,
        env=project_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed = None
    deadline = time.monotonic() + 180
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        state = progress("r1", DRAFT)
        if (
            state
            and state.get("phase") == "transfer"
            and 3 <= state["chunks_verified"] < state["chunks_total"] - 2
        ):
            os.kill(state["pid"], signal.SIGKILL)  # the relay's module process, started by this test
            killed = state["chunks_verified"]
        time.sleep(0.1)
    output, _ = proc.communicate(timeout=300)
    assert killed is not None, f"rank 1 never got part-way: {output[-3000:]}"
    assert proc.returncode != 0
    assert not rank_path("r1", DRAFT).exists()  # nothing half-written where the launch mounts
    staged = rank_path("r1", DRAFT).parent / ".sparkring-models" / "bulk.staging"
    assert list(staged.glob("*.partial"))

    resumed = model_ring(stage.argv())
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    assert progress("r1", DRAFT)["resumed_chunks"] >= killed
    everywhere(stage)


def test_rank1_without_room_is_refused_before_any_byte_moves(clean, model_ring):
    stage = clean
    done = model_ring(stage.argv("-e", '{"reserve_bytes": {"r1": 1152921504606846976}}'))
    assert done.returncode != 0
    assert re.search(
        r"rank 1: sim-target needs \d+ more bytes at /opt/sparkring/models-test/sim-tiny", done.stdout
    )
    for host in RANKS:  # rank 0 obtained nothing either: every plan runs before any byte moves
        assert not rank_path(host, TARGET).parent.exists(), host


def test_a_revision_other_than_the_locks_is_refused_before_any_transfer(clean, model_ring):
    stage = clean
    stage.write_profile(MODEL_REVISION="sim-tiny-v2")
    try:
        done = model_ring(stage.argv())
    finally:
        stage.write_profile()
    assert done.returncode != 0
    assert (
        f"MODEL_REVISION: sim-tiny-v2 in {stage.profile}, but {stage.lock} models.sim-target.revision pins sim-tiny-v1"
    ) in done.stdout
    for host in RANKS:
        assert not rank_path(host, TARGET).parent.exists(), host


BULK_GIB = os.environ.get("SPARKRING_MODEL_STAGE_GIB")


@pytest.mark.slow
@pytest.mark.skipif(
    not BULK_GIB,
    reason="opt-in (SPARKRING_MODEL_STAGE_GIB=2): a multi-GiB checkpoint through the stage takes minutes on "
    "2 cores; the lean tests above move 18 MiB through the same code, and benchmarks/model_fanout moves 2 GiB",
)
def test_a_multi_gib_checkpoint_goes_through_the_stage(model_ring, tmp_path_factory):
    stage = Stage(tmp_path_factory.mktemp("model-bulk"), draft_mib=int(BULK_GIB) * 1024, shards=4)
    clean_ranks()
    try:
        done = model_ring(stage.argv(model_chunk_size=16 << 20), timeout=3600)
        assert done.returncode == 0, done.stdout[-6000:]
        for host in RANKS:  # every rank's files verify, hashed here from the host
            assert holds(host, DRAFT, stage.draft_files), host
        again = model_ring(stage.argv(model_chunk_size=16 << 20), timeout=1200)
        assert again.returncode == 0, again.stdout[-4000:]
        assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.stdout[-3000:]
    finally:
        clean_ranks()
