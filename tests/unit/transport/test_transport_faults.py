"""A dead or stalled rank: every survivor raises an error naming a peer, never hangs.

Both engine paths: 16 KB all-reduces move one frame each way on the caller's thread; 4 MB
ones move 16 frames each way, sends and receives on their own threads, adding in place.
"""

from __future__ import annotations

import functools
import signal

import numpy as np
import pytest
from transport_ranks import PREFIX, fault_mid_burn

from transport.comm import Communicator
from transport.errors import PeerClosedError, PeerTimeoutError, TransportError
from transport.topology import cable_geometry

BOUND_S = 3.0
WORLD = 4
ELEMENTS = {"16KB": 4096, "4MB": 1 << 20}  # fp32


def burn_until_failure(rank: int, tcp_port: int, progress, queue, elements: int) -> None:
    spec = cable_geometry(rank, WORLD, PREFIX)
    x = np.ones(elements, dtype=np.float32)
    with Communicator(spec, tcp_port=tcp_port, timeout_s=BOUND_S) as comm:
        while True:
            try:
                y = comm.all_reduce(x)
            except TransportError as exc:
                queue.put((rank, type(exc).__name__, exc.peer_rank, exc.collective, str(exc)))
                return
            assert y[0] == WORLD
            progress[rank] += 1


def _fault(tcp_port: int, sig: int, size: str) -> dict[int, tuple]:
    burn = functools.partial(burn_until_failure, elements=ELEMENTS[size])
    return fault_mid_burn(burn, WORLD, tcp_port, sig, BOUND_S)


@pytest.mark.parametrize(("size", "port"), [("16KB", 28650), ("4MB", 28652)])
def test_killed_rank_makes_every_survivor_fail_naming_a_peer(size: str, port: int) -> None:
    reports = _fault(port, signal.SIGKILL, size)
    assert set(reports) == {0, 1, 3}
    for rank, (name, peer, collective, message) in reports.items():
        assert name in (PeerClosedError.__name__, PeerTimeoutError.__name__)
        assert collective == "all_reduce" and message.startswith(f"all_reduce on rank {rank}:")
        # Every survivor names the rank that died, rank 0 too (its neighbours told it).
        assert peer == 2 and "rank 2 (" in message and "stopped answering at" in message
        assert f"[peer rank 2 at {PREFIX}." in message
    # The dead rank's neighbours see its connection drop (or hear it first from the far side).
    for rank in (1, 3):
        assert reports[rank][0] == PeerClosedError.__name__ and "its connection closed" in reports[rank][3]
    assert "reported by rank 1" in reports[0][3] or "reported by rank 3" in reports[0][3]


@pytest.mark.parametrize(("size", "port"), [("16KB", 28660), ("4MB", 28662)])
def test_stalled_rank_times_out_its_neighbours(size: str, port: int) -> None:
    reports = _fault(port, signal.SIGSTOP, size)
    assert set(reports) == {0, 1, 3}
    for rank in (1, 3):
        name, peer, _, message = reports[rank]
        assert (name, peer) == (PeerTimeoutError.__name__, 2)
        assert "rank 2 (" in message and "stopped answering at" in message and "nothing heard for" in message
    # Rank 0 names rank 2 too: the verdict of rank 1 or 3.
    assert reports[0][:2] == (PeerTimeoutError.__name__, 2)
