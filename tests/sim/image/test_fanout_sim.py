"""The image fan-out on the simulated ring: a real image archive over the veth ring links to the
three other ranks, loaded, identity-checked; and the faults the issue names."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from image_sim import (
    RANKS,
    ROOT,
    TEST_DEST,
    env,
    fanout_argv,
    image_id,
    progress,
    rank_path,
    recap,
    run,
)

from benchmarks.fanout.netns_ring import AGENT, finish, inventory_hostvars, pair_links, start_agent

pytestmark = pytest.mark.sim


def archive_name(ref: str) -> str:
    return f"sparkring-image-{image_id('r0', ref).split(':')[1][:16]}.tar.zst"


def rank_files(host: str) -> list[str]:
    directory = rank_path(host, TEST_DEST)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def assert_identical_everywhere(ref: str) -> None:
    ids = {host: image_id(host, ref) for host in RANKS}
    assert len(set(ids.values())) == 1 and ids["r0"] is not None, ids


def test_fanout_reaches_every_rank_and_a_second_run_moves_nothing(clean_ranks):
    ref = clean_ranks
    planned = run(fanout_argv(ref, check=True))
    assert planned.returncode == 0, planned.stdout[-4000:]
    for rank in (1, 2, 3):
        assert f"rank {rank}: lacks archive and image" in planned.stdout
    assert all(image_id(host, ref) is None for host in RANKS[1:])  # check mode moved nothing
    assert all(rank_files(host) == [] for host in RANKS[1:])

    done = run(fanout_argv(ref))
    assert done.returncode == 0, done.stdout[-6000:]
    assert_identical_everywhere(ref)
    name = archive_name(ref)
    for host in RANKS[1:]:
        assert name in rank_files(host) and f"{name}.partial" not in rank_files(host)
        assert progress(host, name)["received_bytes"] > 0
    # progress: one task header for the whole wait, then one line per rank per interval
    assert done.stdout.count("TASK [image_fanout : Follow the transfer") == 1
    for rank in (1, 2, 3):
        assert re.search(rf"^r{rank} \| rank {rank}: .*chunks verified", done.stdout, flags=re.M), rank

    again = run(fanout_argv(ref))
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(counts["changed"] == 0 for counts in recap(again.stdout).values()), again.stdout[-3000:]
    assert "moves nothing" in again.stdout


@pytest.mark.extended(
    "a chunk corrupted at a relay on the ring (25-43 s in the last two clean-clone runs here)"
)
def test_corrupted_chunk_at_a_relay_is_detected_and_resent(clean_ranks):
    ref = clean_ranks
    # rank 1 relays the even chunks to rank 2; it corrupts two of them once
    done = run(fanout_argv(ref, "-e", json.dumps({"fault_corrupt": {"r1": [0, 2]}})))
    assert done.returncode == 0, done.stdout[-6000:]
    assert progress("r2", archive_name(ref))["rejected_chunks"] == 2
    assert_identical_everywhere(ref)


@pytest.mark.extended(
    "a relay killed mid-transfer on the ring (67-71 s in the last two clean-clone runs here)"
)
def test_relay_killed_mid_transfer_resumes(clean_ranks):
    ref = clean_ranks
    name = archive_name(ref)
    # paced to ~2 MB/s per link, so the 12 MiB archive takes several seconds to cross
    proc = subprocess.Popen(
        fanout_argv(ref, "-e", "image_fanout_max_rate_mbit=16"),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        state = progress("r1", name)
        if state and 3 <= state["chunks_verified"] < state["chunks_total"]:
            os.kill(state["pid"], signal.SIGKILL)  # the relay's module process, started by this test
            killed = state["chunks_verified"]
        time.sleep(0.1)
    output, _ = proc.communicate(timeout=300)
    assert killed is not None, f"rank 1 never got part-way: {output[-3000:]}"
    assert proc.returncode != 0
    assert (rank_path("r1", TEST_DEST) / f"{name}.partial").exists()
    assert name not in rank_files("r1")  # never the final name before verification

    resumed = run(fanout_argv(ref))
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    state = progress("r1", name)
    assert state["resumed_chunks"] >= killed
    assert (
        state["received_bytes"]
        < json.loads((rank_path("r0", TEST_DEST) / f"{name}.manifest.json").read_text())["size"]
    )
    assert_identical_everywhere(ref)


def test_rank_without_enough_disk_is_refused_before_any_byte_moves(clean_ranks):
    ref = clean_ranks
    done = run(fanout_argv(ref, "-e", json.dumps({"reserve_bytes": {"r2": 1 << 60}})))
    assert done.returncode != 0
    assert "rank 2:" in done.stdout and "must stay free" in done.stdout
    for host in RANKS[1:]:
        assert rank_files(host) == [], host  # no archive, no .partial, anywhere
        assert image_id(host, ref) is None


def test_different_file_at_the_destination_is_refused_not_overwritten(clean_ranks):
    ref = clean_ranks
    name = archive_name(ref)
    target = rank_path("r3", TEST_DEST) / name
    target.parent.mkdir(parents=True)
    target.write_bytes(b"an older archive under the same name\n")
    done = run(fanout_argv(ref))
    assert done.returncode != 0
    assert "refusing to overwrite" in done.stdout
    assert target.read_bytes() == b"an older archive under the same name\n"
    assert all(rank_files(host) == [] for host in ("r1", "r2"))  # stopped before any byte moved


def test_sender_that_is_not_a_ring_neighbour_is_refused(ring_up, tmp_path):
    """An impostor on cable r1-r2 (an address the inventory does not give rank 1) is refused by
    rank 2's receiver, and a non-adjacent rank cannot even reach it; the real neighbour then sends."""
    hostvars = inventory_hostvars()
    links = pair_links(hostvars, "r1", "r2")
    port_r1 = next(p for p in hostvars["r1"]["sparkring_ports"] if p["peer_host"] == "r2")
    source = tmp_path / "r1"
    source.mkdir()
    (source / "blob.bin").write_bytes(os.urandom(3 << 20))
    manifest = json.loads(
        run(["python3", str(AGENT), "manifest", str(source / "blob.bin"), str(1 << 20)]).stdout
    )
    (tmp_path / "r2").mkdir()
    port = 29612

    def config(directory, rank, host):
        return {
            "files": [manifest],
            "dest": str(tmp_path / directory),
            "rank": rank,
            "world_size": 2,
            "links": links[host],
            "port": port,
            "connect_timeout": 30,
            "io_timeout": 30,
        }

    impostor = "198.19.1.99"
    probe = (
        "import socket,sys,json,struct;"
        "s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=10,source_address=(sys.argv[3],0));"
        "b=json.dumps({'type':'hello','len':0}).encode();s.sendall(struct.pack('!I',len(b))+b);"
        "n=struct.unpack('!I',s.recv(4))[0];print(s.recv(n).decode())"
    )
    connect = ["python3", "-c", probe, port_r1["peer_address"], str(port)]  # then the source address
    address = ["ip", "netns", "exec", "sr-r1", "ip", "addr"]
    run([*address, "add", f"{impostor}/24", "dev", port_r1["interface"]])
    receiver = start_agent("sr-r2", config("r2", 1, "r2"))
    try:
        for _ in range(100):
            reply = run(["ip", "netns", "exec", "sr-r1", *connect, impostor])
            if reply.returncode == 0:
                break
            time.sleep(0.1)
        diagonal = run(
            ["ip", "netns", "exec", "sr-r0", *connect, hostvars["r0"]["sparkring_ports"][0]["address"]]
        )
        sender = start_agent("sr-r1", config("r1", 0, "r1"))
        results = finish({"r1": sender, "r2": receiver}, timeout=60)
    finally:
        run([*address, "del", f"{impostor}/24", "dev", port_r1["interface"]])
        if receiver.poll() is None:
            receiver.kill()
    assert f"not from {impostor}" in reply.stdout, (reply.stdout, reply.stderr[-2000:])
    assert "only from its ring neighbour rank 0" in reply.stdout
    assert diagonal.returncode != 0  # forwarding is off: rank 0 has no path to cable r1-r2
    assert not results["r1"]["failed"] and not results["r2"]["failed"], results
    assert [r["address"] for r in results["r2"]["refused"]] == [impostor]
    assert (tmp_path / "r2" / "blob.bin").read_bytes() == (source / "blob.bin").read_bytes()
