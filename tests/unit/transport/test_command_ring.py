"""The command ring and its native progress thread, with a host thread as the producer.

The GPU is only one more producer of the same ring (transport.gpu), so everything here is
what a CUDA graph relies on: the progress thread's bytes are the host communicator's, it
answers in order across wrap-around, a full ring makes the producer wait (bounded) instead
of overwriting, a reused or skipped sequence is refused and its waiter released, and a dead
or stalled peer releases every waiter with an error naming that peer.
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import torch
from transport_ranks import PREFIX, fault_mid_burn, run_ring

from transport import plan as plans
from transport._native import RING_SLOTS, CmdC
from transport.comm import Communicator
from transport.command_ring import CommandRing, host_memory
from transport.errors import PeerTimeoutError, TransportError
from transport.topology import cable_geometry

SIZES = (1, 7, 4097, 2**20 + 3)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ARENA = 16 << 20
NOOP = plans.Plan(plans.ALL_GATHER, "all_gather", 0, 0, 0, 0, 0, 0, 0, ())


def _inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + n)
    return (torch.randn(n, generator=gen) * 4).to(dtype)


def same_bytes_as_host(spec, port, connections):
    """Every dtype, size and algorithm: command ring result == host communicator result, bitwise.
    With several connections per link, transfers from 16 KiB are striped over them."""
    algorithms = ["auto", "ring"]  # at two ranks "ring" is reduce-scatter + all-gather (bench _rsag)
    if spec.world == 4:
        algorithms.append("crossed")
    mismatches = []
    with Communicator(
        spec, tcp_port=port, timeout_s=30, connections=connections, stripe_min_bytes=16 << 10
    ) as comm:
        cases = [(n, d, a) for n in SIZES for d in DTYPES for a in algorithms]
        host = {(n, d, a): comm.all_reduce(_inputs(spec.rank, n, d), algorithm=a) for n, d, a in cases}
        if spec.world == 2:  # a0 + a1 either way: the two schedules give the same bytes
            mismatches += [
                f"ring != exchange {n, d}"
                for n, d, a in cases
                if a == "ring"
                and not torch.equal(host[n, d, a].view(torch.int16), host[n, d, "auto"].view(torch.int16))
            ]
        q = _inputs(spec.rank, 3 * 8 * 16, torch.bfloat16).reshape(3, 8, 16)
        gathers = {dim: comm.all_gather(q, dim=dim) for dim in (0, 1, -1)}
        ring = CommandRing(comm, host_memory(ARENA), spin_us=50)
        for key, want in host.items():
            got = ring.all_reduce(_inputs(spec.rank, key[0], key[1]), algorithm=key[2])
            if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                mismatches.append(str(key))
        for dim, want in gathers.items():
            if not torch.equal(ring.all_gather(q, dim=dim).view(torch.int16), want.view(torch.int16)):
                mismatches.append(f"all_gather dim {dim}")
        # The pipelined plans the GPU uses for large messages (pieces of `chunk`) give the same bytes.
        for key in [k for k in host if k[0] >= 4097]:
            got = ring.all_reduce(_inputs(spec.rank, key[0], key[1]), algorithm=key[2], chunk=64 << 10)
            if not torch.equal(got.view(torch.int16), host[key].view(torch.int16)):
                mismatches.append(f"{key} pipelined")
        # The snapshot plan of a fabric that cannot add in place (verbs) gives the same bytes.
        ring.adds_in_place = False
        snapshots = [(n, torch.float16, a) for n in SIZES[2:] for a in algorithms if a != "ring"]
        for key in snapshots:
            got = ring.all_reduce(_inputs(spec.rank, key[0], key[1]), algorithm=key[2])
            if not torch.equal(got.view(torch.int16), host[key].view(torch.int16)):
                mismatches.append(f"{key} with snapshots")
        stats = ring.stats()
        ring.close()
        striped = sum(link["stripe_bytes_tx"] for link in comm.stats().values())
    return mismatches, stats, len(host) + len([k for k in host if k[0] >= 4097]) + len(snapshots), striped


@pytest.mark.parametrize(("world", "connections"), [(2, 1), (4, 2)])
def test_progress_thread_bytes_equal_the_host_path(world, connections):
    results = run_ring(same_bytes_as_host, world, 28900 + world, connections=connections)
    for status, value in results:
        assert status == "ok", value
        mismatches, stats, n_reduce, striped = value
        assert (striped > 0) == (connections > 1)
        assert mismatches == []
        assert stats["all_reduce"] == n_reduce and stats["all_gather"] == 3
        assert stats["errors"] == stats["refused"] == 0
        # Where the time went: running plans, part of it (pipelined steps) waiting for input.
        assert stats["plan_ns"] > 0 and 0 <= stats["input_wait_ns"] <= stats["plan_ns"]


def ordering_and_wrap(spec, port):
    """Rank 0 posts 3 x 60 commands without waiting between them (wrapping the 64 slots twice)."""
    with Communicator(spec, tcp_port=port, timeout_s=10) as comm:
        ring = CommandRing(comm, host_memory(4096), spin_us=50)
        pid = ring.register(NOOP)
        answered_in_order = True
        if spec.rank == 0:
            for _batch in range(3):
                seqs = [ring.submit(pid) for _ in range(60)]
                ring.wait(seqs[-1], "noop")
                # The last answer implies every earlier one: the thread answers strictly in order.
                answered_in_order &= all(
                    ring.lib.sr_ring_wait(ring.memory.ring, s, 0, None) == 0 for s in seqs
                )
        stats = ring.stats()
        ring.close()
    return answered_in_order, stats


def test_commands_are_answered_in_order_across_wrap_around():
    (s0, (ok, stats)), _ = run_ring(ordering_and_wrap, 2, 28910)
    assert s0 == "ok" and ok
    assert stats["all_gather"] == 180 and stats["last_seq"] == 180 > 2 * RING_SLOTS


def full_ring(spec, port):
    """A stalled consumer: 64 posts fit, the 65th waits its bound and is not written."""
    with Communicator(spec, tcp_port=port, timeout_s=1.0) as comm:
        ring = CommandRing(comm, host_memory(4096), spin_us=50)
        pid = ring.register(NOOP)
        out = {}
        if spec.rank == 0:
            ring.pause(True)
            seqs = [ring.submit(pid) for _ in range(RING_SLOTS)]
            start = time.monotonic()
            try:
                ring.submit(pid)
                out["65th"] = "posted"
            except PeerTimeoutError as exc:
                out["65th"] = str(exc)
            out["waited_s"] = time.monotonic() - start
            out["answered_while_paused"] = ring.stats()["last_seq"]
            ring.pause(False)
            ring.wait(seqs[-1], "noop")
            out["after"] = ring.wait(ring.submit(pid), "noop")
            out["stats"] = ring.stats()
        ring.close()
    return out


def test_a_full_ring_makes_the_producer_wait_not_overwrite():
    (status, out), _ = run_ring(full_ring, 2, 28920)
    assert status == "ok", out
    assert "stayed full" in out["65th"]
    assert out["waited_s"] >= 0.9  # it waited its bound rather than overwriting slot 1
    assert out["answered_while_paused"] == 0
    assert out["stats"]["last_seq"] == RING_SLOTS + 1 and out["stats"]["refused"] == 0


def reused_sequence(spec, port, skip):
    """Rank 0 posts a reused (or skipped) sequence; rank 1 waits in an all-reduce."""
    with Communicator(spec, tcp_port=port, timeout_s=20) as comm:
        ring = CommandRing(comm, host_memory(ARENA), spin_us=50)
        noop = ring.register(NOOP)
        x = np.ones(1024, dtype=np.float32)
        result: dict = {}
        ring.all_reduce(x)  # both ranks are set up before rank 0 breaks the ring (a slow rank 1 may not be)
        try:
            if spec.rank == 0:
                for _ in range(70):
                    ring.wait(ring.submit(noop), "noop")
                # A skipped sequence, or one used before whose slot now holds a later answer.
                bad = 70 + 5 if skip else 3
                cmd = CmdC(0, noop, NOOP.kind, NOOP.code, 0, 0, 0, 0)
                assert ring.post_raw(bad, cmd, 1000) == 0
                result["waiter_status"] = ring.lib.sr_ring_wait(ring.memory.ring, bad, 5000, None)
                ring.check("noop")
            else:
                ring.all_reduce(x)
        except TransportError as exc:
            result["error"] = (type(exc).__name__, exc.peer_rank, str(exc))
        result["stats"] = ring.stats() if ring._handle else None
    return result


@pytest.mark.parametrize("skip", [False, True], ids=["reused", "skipped"])
def test_a_reused_or_skipped_sequence_is_refused_and_its_waiter_released(skip):
    (s0, r0), (s1, r1) = run_ring(reused_sequence, 2, 28930 + int(skip), skip=skip)
    assert s0 == s1 == "ok", (r0, r1)
    assert r0["waiter_status"] == 4, r0  # SR_ESEQ: released with an error, not left waiting
    kind, _peer, message = r0["error"]
    assert kind == "ProtocolError" and "sequence" in message
    # Rank 0's failure aborted its links: rank 1 learns at once that rank 0 is gone.
    kind, peer, message = r1["error"]
    assert kind in ("PeerClosedError", "ProtocolError") and peer == 0, message


BOUND_S = 3.0


def burn_on_command_ring(rank: int, tcp_port: int, progress, queue) -> None:
    """16 KB all-reduces through the progress thread until one fails; report what it raised."""
    spec = cable_geometry(rank, 4, PREFIX)
    with Communicator(spec, tcp_port=tcp_port, timeout_s=BOUND_S) as comm:
        ring = CommandRing(comm, host_memory(ARENA), spin_us=50)
        x = np.ones(4096, dtype=np.float32)
        while True:
            start = time.monotonic()
            try:
                y = ring.all_reduce(x)
            except TransportError as exc:
                queue.put((rank, type(exc).__name__, exc.peer_rank, time.monotonic() - start, str(exc)))
                return
            assert y[0] == 4
            progress[rank] += 1


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stalled"])
def test_a_dead_or_stalled_peer_releases_every_waiter_naming_it(sig):
    reports = fault_mid_burn(burn_on_command_ring, 4, 28940 + (sig == signal.SIGSTOP), sig, BOUND_S)
    assert set(reports) == {0, 1, 3}
    for rank, (kind, peer, waited_s, message) in reports.items():
        assert kind in ("PeerClosedError", "PeerTimeoutError"), message
        assert waited_s < BOUND_S + 5.0, (rank, waited_s)  # within the bound plus the waiter's margin
        assert f"[peer rank {peer} at {PREFIX}." in message
    for rank in (1, 3):  # rank 2's neighbours name it
        assert reports[rank][1] == 2, reports[rank]


def register_too_large(spec, port):
    with Communicator(spec, tcp_port=port, timeout_s=5) as comm:
        ring = CommandRing(comm, host_memory(4096), spin_us=50)
        try:
            ring.register(plans.all_reduce(spec.rank, spec.world, 4096, 0))
        except ValueError as exc:
            return str(exc)
        finally:
            ring.close()


def test_registering_a_plan_larger_than_the_arena_is_refused():
    for status, message in run_ring(register_too_large, 2, 28950):
        assert status == "ok" and "arena" in message, message


def host_collective_while_driven(spec, port):
    with Communicator(spec, tcp_port=port, timeout_s=5) as comm:
        ring = CommandRing(comm, host_memory(4096), spin_us=50)
        try:
            comm.all_reduce(np.ones(4, dtype=np.float32))
        except TransportError as exc:
            refused = str(exc)
        ring.close()
        after = comm.all_reduce(np.ones(4, dtype=np.float32))  # detached: the host path again
    return refused, float(after[0])


def test_the_communicator_refuses_host_collectives_while_a_ring_drives_it():
    for status, (refused, after) in run_ring(host_collective_while_driven, 2, 28960):
        assert status == "ok" and "command ring" in refused and after == 2.0
