"""The model stage's module on real files: rank 0 obtains from a source directory, two ranks
fan out over loopback sockets, and the faults leave the model directory old or complete."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

from model_harness import CHUNK, finish, pinned_files, start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_args(path: Path, files: list[dict], **extra) -> dict:
    return {
        "name": "tiny",
        "revision": "tiny-v1",
        "path": str(path),
        "files": files,
        "chunk_size": CHUNK,
        "reserve_bytes": 0,
        **extra,
    }


def ring_args(rank: int, port: int) -> dict:
    """A pair on cable 127.77.0.0/24: rank 0 at .1, rank 1 at .2."""
    ports = [
        {"peer_rank": 1 - rank, "address": f"127.77.0.{rank + 1}", "peer_address": f"127.77.0.{2 - rank}"}
    ]
    return {
        "rank": rank,
        "world_size": 2,
        "ports": ports,
        "port": port,
        "connect_timeout": 20,
        "io_timeout": 20,
    }


def record(path: Path) -> dict:
    return json.loads((path.parent / ".sparkring-models" / f"{path.name}.json").read_text())


def same_tree(path: Path, source: Path) -> bool:
    got = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    want = sorted(str(p.relative_to(source)) for p in source.rglob("*") if p.is_file())
    return got == want and all((path / n).read_bytes() == (source / n).read_bytes() for n in want)


class Pair:
    """Rank 0 obtains from the source; then both ranks run state=present at once."""

    def __init__(self, tmp_path: Path, source: Path) -> None:
        self.tmp_path, self.source = tmp_path, source
        self.files = pinned_files(source)
        self.paths = [tmp_path / f"r{r}" / "models" / "tiny" for r in (0, 1)]
        self.port = free_port()
        self.fileset = None

    def obtain(self, run_model) -> dict:
        done = run_model(
            model_args(self.paths[0], self.files, state="obtained", source_dir=str(self.source), rank=0)
        )
        self.fileset = done.get("fileset")
        return done

    def present(self, check: bool = False, **per_rank) -> list[dict]:
        procs = [
            start(
                model_args(
                    self.paths[r],
                    self.files,
                    fileset=self.fileset,
                    **ring_args(r, self.port),
                    **per_rank.get(f"r{r}", {}),
                ),
                self.tmp_path,
                check=check,
                diff=True,
            )
            for r in (0, 1)
        ]
        return [finish(proc) for proc in procs]


def test_rank0_obtains_from_its_source_once(run_model, checkpoint, tmp_path):
    files = pinned_files(checkpoint)
    target = tmp_path / "r0" / "models" / "tiny"
    args = model_args(target, files, state="obtained", source_dir=str(checkpoint), rank=0)

    plan = run_model(args, check=True, diff=True)
    assert plan["changed"] and not plan.get("failed"), plan
    assert plan["lacks"] == [f["path"] for f in files]
    assert plan["lacks_bytes"] == sum(f["size"] for f in files)
    assert "model-00001-of-00002.safetensors 327803 (moves 327803 bytes)" in plan["diff"]["after"]
    assert not target.exists() and not (target.parent / ".sparkring-models").exists()

    done = run_model(args)
    assert done["changed"] and not done.get("failed"), done
    assert done["obtained_bytes"] == sum(f["size"] for f in files)
    assert same_tree(target, checkpoint)
    assert all(p.stat().st_mode & 0o777 == 0o444 for p in target.rglob("*") if p.is_file())
    assert record(target)["manifest_sha256"] == done["manifest_sha256"]
    assert sorted(m["name"] for m in done["fileset"]) == [f["path"] for f in files]
    assert sorted(p.name for p in (target.parent / ".sparkring-models").iterdir()) == [
        "tiny.json",
        "tiny.progress.json",
    ]

    again = run_model(args)
    assert not again["changed"] and again["obtained_bytes"] == 0 and again["record"] == "current"
    assert again["fileset"] == done["fileset"]


def test_a_source_without_the_pinned_bytes_is_refused_before_the_model_directory_changes(
    run_model, checkpoint, tmp_path
):
    files = pinned_files(checkpoint)
    target = tmp_path / "r0" / "models" / "tiny"
    shard = checkpoint / "weights" / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[CHUNK + 5] ^= 0xFF
    shard.write_bytes(bytes(data))
    done = run_model(model_args(target, files, state="obtained", source_dir=str(checkpoint), rank=0))
    assert done.get("failed"), done
    assert "weights/model-00002-of-00002.safetensors" in done["msg"]
    assert "does not hold the pinned revision" in done["msg"]
    assert not target.exists()  # never a model directory holding an unverified file

    shard.unlink()
    planned = run_model(
        model_args(target, files, state="obtained", source_dir=str(checkpoint), rank=0), check=True
    )
    assert planned.get("failed") and "model-00002-of-00002.safetensors: missing" in planned["msg"]


def test_two_ranks_fan_out_and_a_second_run_moves_nothing(run_model, checkpoint, tmp_path):
    pair = Pair(tmp_path, checkpoint)
    assert not pair.obtain(run_model).get("failed")
    plans = pair.present(check=True)
    assert not plans[0]["changed"] and plans[1]["changed"]
    assert plans[1]["lacks_bytes"] == sum(f["size"] for f in pair.files)

    results = pair.present()
    assert all(not r.get("failed") for r in results), results
    assert results[1]["received_bytes"] == sum(f["size"] for f in pair.files)
    assert same_tree(pair.paths[1], checkpoint)
    assert record(pair.paths[1])["manifest_sha256"] == record(pair.paths[0])["manifest_sha256"]
    assert not (pair.paths[1].parent / ".sparkring-models" / "tiny.staging").exists()

    again = pair.present()
    assert all(not r["changed"] and r["received_bytes"] == 0 for r in again), again


def test_a_damaged_copy_is_resumed_from_its_good_chunks_and_swapped_in_whole(run_model, checkpoint, tmp_path):
    pair = Pair(tmp_path, checkpoint)
    pair.obtain(run_model)
    assert all(not r.get("failed") for r in pair.present())
    shard = pair.paths[1] / "weights" / "model-00001-of-00002.safetensors"
    config_inode = (pair.paths[1] / "config.json").stat().st_ino
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as handle:
        handle.truncate(2 * CHUNK + 10)  # two whole chunks survive

    plans = pair.present(check=True)
    assert plans[1]["lacks"] == ["weights/model-00001-of-00002.safetensors"] and plans[1]["changed"]
    results = pair.present()
    assert all(not r.get("failed") for r in results), results
    assert results[1]["resumed_chunks"] == 2
    assert results[1]["received_bytes"] == shard.stat().st_size - 2 * CHUNK
    assert same_tree(pair.paths[1], checkpoint)
    # the untouched files were hard-linked into the new directory, never copied again
    assert (pair.paths[1] / "config.json").stat().st_ino == config_inode


def test_files_not_in_the_manifest_leave_with_the_old_directory(run_model, checkpoint, tmp_path):
    pair = Pair(tmp_path, checkpoint)
    pair.obtain(run_model)
    pair.present()
    os.chmod(pair.paths[1], 0o755)
    (pair.paths[1] / "notes.txt").write_text("not part of the revision\n")
    plans = pair.present(check=True)
    assert plans[1]["extras"] == ["notes.txt"] and plans[1]["lacks"] == []
    results = pair.present()
    assert results[1]["changed"] and results[1]["received_bytes"] == 0
    assert same_tree(pair.paths[1], checkpoint)


def test_a_rank_without_room_is_refused_naming_rank_and_bytes(run_model, checkpoint, tmp_path):
    pair = Pair(tmp_path, checkpoint)
    pair.obtain(run_model)
    plans = pair.present(check=True, r1={"reserve_bytes": 1 << 60})
    assert plans[1].get("failed"), plans[1]
    total = sum(f["size"] for f in pair.files)
    assert f"rank 1: tiny needs {total} more bytes at {pair.paths[1]}" in plans[1]["msg"]
    assert not pair.paths[1].parent.exists()


def test_a_symlinked_folder_in_the_model_directory_is_refused_and_its_target_left_alone(
    run_model, checkpoint, tmp_path
):
    """`weights/ -> /elsewhere` inside MODEL_PATH: the stage once hard-linked the target's files into
    the model and chmod-ed them 0444; it must refuse before touching anything (check mode too)."""
    files = pinned_files(checkpoint)
    target = tmp_path / "r0" / "models" / "tiny"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(checkpoint / "weights", elsewhere)
    target.mkdir(parents=True)
    shutil.copy(checkpoint / "config.json", target / "config.json")
    shutil.copy(checkpoint / "empty.txt", target / "empty.txt")
    (target / "weights").symlink_to(elsewhere, target_is_directory=True)
    before = {p.name: (p.stat().st_mode, p.stat().st_nlink) for p in elsewhere.iterdir()}
    args = model_args(target, files, state="obtained", source_dir=str(checkpoint), rank=0)

    for check in (True, False):
        refused = run_model(args, check=check)
        assert refused.get("failed"), refused
        assert f"{target}/weights is a symlink to {elsewhere}" in refused["msg"]
        assert "remove the link" in refused["msg"]
    assert {p.name: (p.stat().st_mode, p.stat().st_nlink) for p in elsewhere.iterdir()} == before
    assert (target / "weights").is_symlink() and not (
        target.parent / ".sparkring-models" / "tiny.staging"
    ).exists()

    (target / "weights").unlink()
    (target.parent / "linked").symlink_to(target, target_is_directory=True)
    linked = run_model(
        model_args(target.parent / "linked", files, state="obtained", source_dir=str(checkpoint), rank=0)
    )
    assert linked.get("failed") and f"{target.parent}/linked is a symlink to {target}" in linked["msg"], (
        linked
    )
