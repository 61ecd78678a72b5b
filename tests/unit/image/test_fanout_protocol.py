"""The fan-out protocol on loopback: real sockets and files, four ranks as threads."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from image_fanout_ring import LoopbackRing

CHUNK = 256 * 1024


@pytest.mark.parametrize("world_size", [2, 4, 6, 8])
def test_plan_feeds_every_chunk_once_along_both_directions(fanout, world_size):
    chunks = 10
    carried: dict[tuple[int, int], int] = {}
    for rank in range(world_size):
        incoming, outgoing = fanout.plan_routes(world_size, rank)
        got = sorted(i for route in incoming for i in route.indices(chunks))
        assert got == ([] if rank == 0 else list(range(chunks)))
        for route in incoming:
            assert route.peer_rank in ((rank - 1) % world_size, (rank + 1) % world_size)
            # the feeder plans the matching outgoing route
            assert (
                fanout.Route(rank, route.modulus, route.residue)
                in fanout.plan_routes(world_size, route.peer_rank)[1]
            )
        for route in outgoing:
            carried[(rank, route.peer_rank)] = len(route.indices(chunks))
    # no link direction carries more than the archive once, and both directions leave rank 0
    assert max(carried.values()) == chunks
    if world_size > 2:
        assert (0, 1) in carried and (0, world_size - 1) in carried


def test_plan_refuses_odd_rings(fanout):
    with pytest.raises(fanout.FanoutError, match="even number"):
        fanout.plan_routes(3, 0)


def test_manifest_round_trip_and_consistency(fanout, fanout_manifest, tmp_path):
    path = tmp_path / "a.tar.zst"
    path.write_bytes(b"x" * (CHUNK * 2))
    manifest = fanout.build_manifest(str(path), CHUNK, image_ref="r:t", image_id="sha256:" + "0" * 64)
    assert len(manifest.chunks) == 2
    assert fanout_manifest.Manifest.from_dict(manifest.to_dict()) == manifest
    broken = manifest.to_dict() | {"chunks": manifest.chunks[:1]}
    with pytest.raises(fanout.FanoutError, match="expected 2"):
        fanout_manifest.Manifest.from_dict(broken)
    with pytest.raises(fanout.FanoutError, match="unknown keys"):
        fanout_manifest.Manifest.from_dict(manifest.to_dict() | {"extra": 1})


def test_four_rank_fanout_delivers_verified_archives(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 4, archive_bytes, CHUNK)
    results = ring.run()
    for rank in range(4):
        assert not isinstance(results[rank], Exception), results[rank]
        assert ring.path(rank).read_bytes() == archive_bytes
        assert not (ring.dirs[rank] / (ring.manifest.name + ".partial")).exists()
    count = len(ring.manifest.chunks)
    # rank 2 is fed half by rank 1 and half by rank 3; ranks 1 and 3 take everything from rank 0
    assert results[2].received_chunks == count
    assert results[1].sent_bytes == {"2": sum(ring.manifest.chunk_range(i)[1] for i in range(0, count, 2))}
    assert results[3].sent_bytes == {"2": sum(ring.manifest.chunk_range(i)[1] for i in range(1, count, 2))}
    assert results[0].sent_bytes == {"1": len(archive_bytes), "3": len(archive_bytes)}

    again = ring.run()
    assert all(again[r].received_bytes == 0 and not again[r].sent_bytes for r in range(4))


def test_pair_fanout_over_one_cable(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 2, archive_bytes, CHUNK)
    results = ring.run()
    assert results[1].received_bytes == len(archive_bytes)
    assert ring.path(1).read_bytes() == archive_bytes


def test_corrupted_chunk_at_relay_is_detected_and_resent(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 4, archive_bytes, CHUNK)
    results = ring.run({1: {"fault_corrupt_chunks": frozenset({2, 4})}})
    assert not isinstance(results[2], Exception), results[2]
    assert results[2].rejected_chunks == 2
    assert ring.path(2).read_bytes() == archive_bytes


def test_persistent_corruption_fails_naming_the_edge(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 2, archive_bytes, CHUNK)
    results = ring.run({0: {"fault_corrupt_chunks": frozenset({3})}, 1: {"max_resends": 0}})
    assert isinstance(results[1], fanout.FanoutError)
    assert "rank 0 -> rank 1: chunks [3] (of image.tar.zst) failed verification 1 times" in str(results[1])
    assert not ring.path(1).exists()


def test_interrupted_transfer_resumes_from_verified_chunks(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 4, archive_bytes, CHUNK)
    partial = ring.dirs[1] / (ring.manifest.name + ".partial")
    kept = 5
    # what an interrupted run leaves: the first chunks written, one of them torn
    partial.write_bytes(archive_bytes[: kept * CHUNK] + b"\0" * 100)
    with open(partial, "r+b") as handle:
        handle.seek(CHUNK + 7)
        handle.write(b"\xff")
    results = ring.run()
    assert results[1].resumed_chunks == kept - 1
    assert results[1].received_chunks == len(ring.manifest.chunks) - (kept - 1)
    assert ring.path(1).read_bytes() == archive_bytes


def test_different_file_at_destination_is_refused_not_overwritten(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 2, archive_bytes, CHUNK)
    ring.path(1).write_bytes(b"someone else's archive")
    results = ring.run({0: {"connect_timeout": 1.0}})
    assert isinstance(results[1], fanout.FanoutError)
    assert "refusing to overwrite" in str(results[1])
    assert ring.path(1).read_bytes() == b"someone else's archive"


def test_not_enough_disk_is_refused_before_any_byte_moves(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 2, archive_bytes, CHUNK)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    results = ring.run({0: {"connect_timeout": 1.0}, 1: {"reserve_bytes": free}})
    assert isinstance(results[1], fanout.FanoutError)
    assert "must stay free" in str(results[1])
    assert not (ring.dirs[1] / (ring.manifest.name + ".partial")).exists()
    assert isinstance(results[0], fanout.FanoutError)  # the sender never got a listener


def test_sender_that_is_not_a_ring_neighbour_is_refused(fanout, tmp_path, archive_bytes):
    ring = LoopbackRing(fanout, tmp_path, 2, archive_bytes, CHUNK)
    replies: list[str] = []

    def impostor() -> None:
        # on the same cable, but from an address the inventory does not give rank 0
        with socket.create_connection(("127.77.0.2", ring.port), source_address=("127.77.0.9", 0)) as sock:
            fanout.send_msg(sock, {"type": "hello", "protocol": fanout.PROTOCOL, "sha256": ring.files.digest})
            with pytest.raises(fanout.FanoutError) as refused:
                fanout.recv_msg(sock)
            replies.append(str(refused.value))

    # rank 1 listens alone first; the impostor connects before rank 0 does
    results: dict = {}
    agent = threading.Thread(target=lambda: results.update({1: fanout.RankAgent(ring.config(1)).run()}))
    agent.start()
    for _ in range(100):
        try:
            impostor()
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    results[0] = fanout.RankAgent(ring.config(0)).run()
    agent.join()
    assert replies and "only from its ring neighbour rank 0 at 127.77.0.1, not from 127.77.0.9" in replies[0]
    assert results[1].refused[0]["address"] == "127.77.0.9"
    assert ring.path(1).read_bytes() == archive_bytes


@pytest.mark.parametrize("block", [7, 4096, CHUNK - 1, CHUNK, 3 * CHUNK + 5])
def test_streamed_manifest_equals_the_file_manifest(fanout, fanout_manifest, tmp_path, archive_bytes, block):
    path = tmp_path / "a.tar.zst"
    path.write_bytes(archive_bytes[: CHUNK + 77] if block == 7 else archive_bytes)
    data = path.read_bytes()
    builder = fanout_manifest.ManifestBuilder(CHUNK)
    for start in range(0, len(data), block):
        builder.update(data[start : start + block])
    assert builder.finish(path.name) == fanout.build_manifest(str(path), CHUNK)


def checkpoint(size: int) -> dict[str, bytes]:
    """A small multi-file checkpoint: shards in a subdirectory, a config, an empty file."""
    return {
        "config.json": b'{"layers": 2}\n',
        "weights/model-00001-of-00002.safetensors": os.urandom(size),
        "weights/model-00002-of-00002.safetensors": os.urandom(size // 3 + 17),
        "empty.txt": b"",
    }


def test_file_set_numbers_chunks_as_one_stream(fanout, tmp_path):
    ring = LoopbackRing(fanout, tmp_path, 2, checkpoint(3 * CHUNK), CHUNK)
    counts = [len(m.chunks) for m in ring.files.files]
    assert ring.files.count == sum(counts) == 1 + 3 + 2 + 1
    assert ring.files.locate(0) == (0, 0)
    assert ring.files.locate(3) == (1, 2)
    assert ring.files.locate(4) == (2, 0)
    assert ring.files.locate(ring.files.count - 1) == (3, 0)
    with pytest.raises(fanout.FanoutError, match="outside"):
        ring.files.locate(ring.files.count)
    assert fanout.FileSet.from_list(ring.files.to_list()) == ring.files
    # the digest covers names, sizes and contents, not the order the files were listed in
    reordered = fanout.FileSet(tuple(reversed(ring.files.files)))
    assert reordered.digest == ring.files.digest
    renamed = fanout.FileSet((ring.files.files[0],))
    assert renamed.digest != ring.files.digest


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a"])
def test_file_names_must_stay_inside_the_destination(fanout, fanout_manifest, name):
    with pytest.raises(fanout.FanoutError, match="relative path"):
        fanout_manifest.check_relative_name(name)


def test_four_rank_fanout_of_a_checkpoint_resumes_one_damaged_file(fanout, tmp_path):
    files = checkpoint(5 * CHUNK)
    ring = LoopbackRing(fanout, tmp_path, 4, files, CHUNK)
    # rank 2 already holds the config (verified by its caller) and part of the second shard
    shard = "weights/model-00002-of-00002.safetensors"
    (ring.dirs[2] / "weights").mkdir()
    (ring.dirs[2] / "config.json").write_bytes(files["config.json"])
    (ring.dirs[2] / (shard + ".partial")).write_bytes(files[shard][:CHUNK])
    results = ring.run({2: {"complete": frozenset({"config.json"})}})
    for rank in range(4):
        assert not isinstance(results[rank], Exception), results[rank]
        for name, data in files.items():
            assert ring.path(rank, name).read_bytes() == data, (rank, name)
        assert not list(ring.dirs[rank].rglob("*.partial"))
    assert results[2].resumed_chunks == 1
    assert results[2].received_chunks == ring.files.count - 1 - 1  # not the config, not the kept chunk
    assert results[0].sent_bytes == {"1": ring.files.size, "3": ring.files.size}


def test_a_peer_offering_another_file_set_is_refused(fanout, tmp_path):
    ring = LoopbackRing(fanout, tmp_path, 2, checkpoint(CHUNK), CHUNK)
    other = fanout.FileSet(ring.files.files[:2])
    results = ring.run({0: {"files": other}})
    assert isinstance(results[1], fanout.FanoutError)
    assert f"this rank expects {ring.files.digest}" in str(results[1])
    assert not ring.path(1, "config.json").exists()
