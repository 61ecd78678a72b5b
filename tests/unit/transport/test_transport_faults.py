"""A dead or stalled rank: every survivor raises an error naming a peer, never hangs."""

from __future__ import annotations

import signal

import numpy as np
from transport_ranks import PREFIX, fault_mid_burn

from transport.comm import Communicator
from transport.errors import PeerClosedError, PeerTimeoutError, TransportError
from transport.topology import cable_geometry

BOUND_S = 3.0
WORLD = 4


def burn_until_failure(rank: int, tcp_port: int, progress, queue) -> None:
    spec = cable_geometry(rank, WORLD, PREFIX)
    x = np.ones(4096, dtype=np.float32)  # 16 KB
    with Communicator(spec, tcp_port=tcp_port, timeout_s=BOUND_S) as comm:
        while True:
            try:
                y = comm.all_reduce(x)
            except TransportError as exc:
                queue.put((rank, type(exc).__name__, exc.peer_rank, exc.collective, str(exc)))
                return
            assert y[0] == WORLD
            progress[rank] += 1


def _fault(tcp_port: int, sig: int) -> dict[int, tuple]:
    return fault_mid_burn(burn_until_failure, WORLD, tcp_port, sig, BOUND_S)


def test_killed_rank_makes_every_survivor_fail_naming_a_peer() -> None:
    reports = _fault(28650, signal.SIGKILL)
    assert set(reports) == {0, 1, 3}
    for rank, (name, peer, collective, message) in reports.items():
        assert name in (PeerClosedError.__name__, PeerTimeoutError.__name__)
        assert collective == "all_reduce" and message.startswith(f"all_reduce on rank {rank}:")
        assert peer in ((rank + 1) % WORLD, (rank - 1) % WORLD)
        assert f"[peer rank {peer} at {PREFIX}." in message
    # The dead rank's neighbours see its connection drop and name it.
    for rank in (1, 3):
        assert reports[rank][0] == PeerClosedError.__name__ and reports[rank][1] == 2


def test_stalled_rank_times_out_its_neighbours() -> None:
    reports = _fault(28660, signal.SIGSTOP)
    assert set(reports) == {0, 1, 3}
    for rank in (1, 3):
        name, peer, _, message = reports[rank]
        assert (name, peer) == (PeerTimeoutError.__name__, 2)
        assert "timed out after" in message and "rank 2" in message
    assert reports[0][0] in (PeerClosedError.__name__, PeerTimeoutError.__name__)
