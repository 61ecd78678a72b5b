"""A dead ring peer stops the overlay's process with EXIT_PEER_DEAD and a record naming it.

Real processes on the loopback cable geometry, each holding the overlay's ring group as a vLLM
worker would after its first collective, either idle or running all-reduces through the overlay's
wrapper path when the fault comes. Killing one rank makes the others leave within the dead-peer
bound, with the fault record the entrypoint and the endpoint plugin read: a collective that fails
on the dead peer stops its process the same way, not with the raised error.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
from overlay_ranks import free_port

from overlay.endpoint import fault_body
from overlay.fault import EXIT_PEER_DEAD, read_fault, write_fault
from transport.liveness import DEAD_AFTER_S

MARGIN_S = 15.0


def hold_ring(rank: int, world: int, env: dict[str, str], ready) -> None:
    """Join the tp group's ring as the overlay does on a first collective, then stay idle."""
    os.environ.update(env)
    from overlay.ring import GROUPS

    GROUPS.get("tp:0", rank, world)
    ready[rank] = 1
    time.sleep(120)  # the watch ends this process long before


def busy_ring(rank: int, world: int, env: dict[str, str], ready) -> None:
    """Join the ring, then all-reduce through the overlay's wrapper path until the fault ends it."""
    os.environ.update(env)
    import torch

    from overlay.collectives import run_ring
    from overlay.ring import GROUPS

    comm = GROUPS.get("tp:0", rank, world)
    x = torch.ones(1 << 14)
    run_ring("all_reduce", x, comm.all_reduce)
    ready[rank] = 1
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # an exception here exits 1: the test sees it
        run_ring("all_reduce", x, comm.all_reduce)


def run(
    tmp_path: Path, world: int, victim: int, target=hold_ring, sig: int = signal.SIGKILL, **env: str
) -> dict[int, tuple[int | None, dict | None, float]]:
    ctx = mp.get_context("spawn")
    ready = ctx.Array("b", world)
    base = {
        "SPARKRING_RING_PREFIX": "127.77",
        "SPARKRING_TRANSPORT_PORT": str(free_port()),
        "SPARKRING_OVERLAY_RECORDER_DIR": str(tmp_path / "flight"),
        **env,
    }
    envs = [{**base, "SPARKRING_FAULT_PATH": str(tmp_path / f"fault{r}.json")} for r in range(world)]
    procs = [ctx.Process(target=target, args=(r, world, envs[r], ready)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        deadline = time.monotonic() + 120
        while min(ready[:]) == 0:
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                pytest.fail("the ranks did not all join the ring")
            time.sleep(0.05)
        killed = time.monotonic()
        os.kill(procs[victim].pid, sig)
        for r, p in enumerate(procs):
            if r == victim:
                continue
            p.join(DEAD_AFTER_S + MARGIN_S)
            out[r] = (
                p.exitcode,
                read_fault(Path(envs[r]["SPARKRING_FAULT_PATH"])),
                time.monotonic() - killed,
            )
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    return out


@pytest.mark.parametrize("target", [hold_ring, busy_ring], ids=["idle", "in_a_collective"])
def test_every_survivor_leaves_with_the_ring_status_naming_the_dead_rank(tmp_path: Path, target) -> None:
    out = run(tmp_path, 4, victim=2, target=target)
    assert set(out) == {0, 1, 3}
    for rank, (code, record, _) in out.items():
        assert code == EXIT_PEER_DEAD, f"rank {rank} exit {code}"
        assert record is not None and record["rank"] == rank and record["dead_rank"] == 2
        assert record["message"].startswith("rank 2 (127.77.") and "stopped answering at" in record["message"]
        assert record["exit_status"] == EXIT_PEER_DEAD and record["group"] == "tp:0"
    # Each names a cable of rank 2: its own, or the other neighbour's when that verdict (forwarded round
    # the ring) reached it first, which on a loaded machine it can.
    cables_of_rank_2 = {"r1 cage1 <-> r2 cage1", "r3 cage0 <-> r2 cage0"}
    assert {record["cable"] for _, record, _ in out.values()} <= cables_of_rank_2
    assert out[0][1]["reported_by"] in (1, 3)
    # Each survivor dumped its flight recorder with the cause.
    flight = [json.loads(p.read_text()) for p in (tmp_path / "flight").glob("overlay-flight-*.json")]
    assert len(flight) == 3 and all(d["reason"].startswith("peer dead: rank 2 (") for d in flight)


def test_a_frozen_rank_is_named_though_the_collectives_time_out_first(tmp_path: Path) -> None:
    """Rank 2 stops (SIGSTOP) without closing its links while the others all-reduce under a
    collective timeout (2 s) below the dead-peer bound (5 s): the timeout is a verdict too, so each
    survivor leaves with 69 naming rank 2 as silent, not with the timeout raised into vLLM."""
    timeout_s = "2"
    assert float(timeout_s) < DEAD_AFTER_S
    out = run(tmp_path, 4, 2, busy_ring, signal.SIGSTOP, SPARKRING_TRANSPORT_TIMEOUT_S=timeout_s)
    for rank, (code, record, _) in out.items():
        assert code == EXIT_PEER_DEAD, f"rank {rank} exit {code}"
        assert record is not None and record["dead_rank"] == 2 and not record["closed"], record


def test_fault_record_round_trip_and_the_error_body(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    assert read_fault(path) is None
    write_fault(
        {"rank": 0, "message": "rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped answering at T"}, path
    )
    record = read_fault(path)
    assert record is not None and record["schema"] == "sparkring.fault/1"
    body = fault_body(record)
    assert body["error"]["code"] == 503
    assert (
        body["error"]["message"]
        == "the ring failed: rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped answering at T"
    )
    path.write_text('{"schema": "other"}')
    assert read_fault(path) is None
