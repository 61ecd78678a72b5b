"""Schedules and ring geometry: pure checks that every rank ends with every contribution."""

from __future__ import annotations

import numpy as np
import pytest

from transport import schedule
from transport.topology import Port, RingSpec, Twin, cable_geometry, from_hostvars


def test_four_rank_matchings_follow_the_cages() -> None:
    assert {r: schedule.matching_peers(r, 4) for r in range(4)} == {
        0: [1, 3],
        1: [0, 2],
        2: [3, 1],
        3: [2, 0],
    }
    for rank in range(4):
        spec = cable_geometry(rank, 4, "198.19")
        for round_no, peer in enumerate(schedule.matching_peers(rank, 4)):
            assert peer == [rank ^ 1, rank ^ 3][round_no]
            assert spec.port_to(peer).cage == round_no


@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_matchings_are_symmetric_neighbour_pairings(world: int) -> None:
    for round_no in range(len(schedule.matching_peers(0, world))):
        for rank in range(world):
            peer = schedule.matching_peers(rank, world)[round_no]
            assert schedule.matching_peers(peer, world)[round_no] == rank
            assert (peer - rank) % world in (1, world - 1)


@pytest.mark.parametrize("direction", schedule.RING_DIRECTIONS)
@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_ring_steps_deliver_every_contribution_once(world: int, direction: int) -> None:
    # Symbolic run: each chunk holds the set of ranks summed into it, per rank.
    held = [[{r} for _ in range(world)] for r in range(world)]
    for step_no in range(2 * (world - 1)):
        steps = [schedule.ring_steps(r, world, direction)[step_no] for r in range(world)]
        sent = [set(held[r][steps[r].send]) for r in range(world)]
        for r in range(world):
            src = (r - direction) % world
            assert steps[src].send == steps[r].recv, (
                "a rank must receive the chunk its upstream neighbour sends"
            )
            incoming = sent[src]
            if steps[r].add:
                assert not held[r][steps[r].recv] & incoming, "a contribution was added twice"
                held[r][steps[r].recv] |= incoming
            else:
                held[r][steps[r].recv] = set(incoming)
    assert all(chunk == set(range(world)) for rank_chunks in held for chunk in rank_chunks)


@pytest.mark.parametrize("world", [2, 4])
def test_gather_rounds_assemble_all_blocks(world: int) -> None:
    have = [{r} for r in range(world)]
    for round_no in range(len(schedule.gather_rounds(0, world))):
        plans = [schedule.gather_rounds(r, world)[round_no] for r in range(world)]
        new = [set(h) for h in have]
        for r, (peer, sent, got) in enumerate(plans):
            assert set(sent) <= have[r]
            assert plans[peer][1] == got and plans[peer][0] == r
            new[r] |= set(got)
        have = new
    assert all(h == set(range(world)) for h in have)


def test_chunk_bounds_cover_in_order() -> None:
    assert schedule.chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert schedule.chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_algorithm_choice() -> None:
    assert schedule.allreduce_algorithm(2, 1 << 30) == "exchange"
    assert schedule.allreduce_algorithm(4, 16384) == "matching"
    assert schedule.allreduce_algorithm(4, schedule.RING_THRESHOLD_BYTES) == "matching"
    assert schedule.allreduce_algorithm(4, schedule.RING_THRESHOLD_BYTES + 4) == "ring"
    assert schedule.allreduce_algorithm(4, 64 << 20) == "ring"
    assert schedule.allreduce_algorithm(6, 16) == "ring"
    assert schedule.allreduce_algorithm(4, 16, "crossed") == "crossed"
    with pytest.raises(ValueError, match="does not fit a ring of 6"):
        schedule.allreduce_algorithm(6, 16, "matching")
    with pytest.raises(ValueError, match="does not fit a ring of 2"):
        schedule.allreduce_algorithm(2, 16, "crossed")
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        schedule.allreduce_algorithm(4, 16, "tree")


def test_crossed_rounds_keep_both_cables_busy_with_one_half_each() -> None:
    for rank in range(4):
        peers = schedule.matching_peers(rank, 4)
        rounds = schedule.matching_lanes(rank, 4, 11, "crossed")
        assert rounds == [[(peers[0], 0, 6), (peers[1], 6, 11)], [(peers[1], 0, 6), (peers[0], 6, 11)]]


def test_cable_geometry_matches_the_inventory_contract() -> None:
    spec = cable_geometry(0, 4, "198.19")
    assert spec.ports == (
        Port(0, "198.19.0.1", 1, "198.19.0.2"),
        Port(1, "198.19.3.2", 3, "198.19.3.1"),
    )
    assert cable_geometry(1, 4, "198.19").ports == (
        Port(0, "198.19.0.2", 0, "198.19.0.1"),
        Port(1, "198.19.1.1", 2, "198.19.1.2"),
    )
    assert cable_geometry(1, 2, "198.19").ports == (Port(0, "198.19.0.2", 0, "198.19.0.1"),)


def test_ring_spec_refuses_non_neighbours_and_odd_rings() -> None:
    with pytest.raises(ValueError, match="ring neighbour set is"):
        RingSpec(0, 4, (Port(0, "a", 1, "b"), Port(1, "c", 2, "d")))
    with pytest.raises(ValueError, match="an even number >= 4"):
        RingSpec(0, 3, ())
    with pytest.raises(ValueError, match="only ring neighbours are reachable"):
        cable_geometry(0, 4, "198.19").port_to(2)


def test_from_hostvars_reads_the_contract_names() -> None:
    hostvars = {
        "sparkring_rank": 3,
        "sparkring_world_size": 4,
        "sparkring_ports": [
            {
                "cage": 0,
                "address": "198.19.2.2",
                "peer_rank": 2,
                "peer_address": "198.19.2.1",
                "twins": [{"rdma_device": None, "rdma_port": None, "gid_index": None}],
            },
            {
                "cage": 1,
                "address": "198.19.3.1",
                "peer_rank": 0,
                "peer_address": "198.19.3.2",
                "twins": [
                    {"rdma_device": "rocep1s0f1", "rdma_port": 1, "gid_index": 3},
                    {"rdma_device": "roceP2p1s0f1", "rdma_port": 1, "gid_index": None},
                ],
            },
        ],
    }
    spec = from_hostvars(hostvars)
    assert spec.rank == 3 and spec.left == 2 and spec.right == 0
    assert spec.port_to(2).twins == ()  # tcp: no RDMA devices
    assert spec.port_to(0).twins == (Twin("rocep1s0f1", 1, 3), Twin("roceP2p1s0f1", 1, "auto"))


def test_ring_halves_split_in_two_with_the_odd_element_first() -> None:
    assert schedule.ring_halves(7) == [(0, 4), (4, 7)]
    assert schedule.ring_halves(1) == [(0, 1), (1, 1)]
    assert schedule.ring_halves(0) == [(0, 0), (0, 0)]


def test_the_ring_reference_accumulates_each_half_in_its_direction() -> None:
    # Strings make the order of every add visible: chunk c of the clockwise half is
    # ((a_c + a_c+1) + ...), of the counter-clockwise half ((a_c + a_c-1) + ...).
    from transport import reference

    world, count = 4, 11  # halves of 6 and 5 elements: chunks of unequal length
    inputs = [np.array([str(r)] * count, dtype=object) for r in range(world)]
    got = reference.all_reduce(inputs, 0, "ring")
    halves = [
        schedule.chunk_bounds(6, world),
        [(lo + 6, hi + 6) for lo, hi in schedule.chunk_bounds(5, world)],
    ]
    for d, bounds in zip(schedule.RING_DIRECTIONS, halves, strict=True):
        for c, (lo, hi) in enumerate(bounds):
            want = "".join(str((c + d * k) % world) for k in range(world))
            assert list(got[lo:hi]) == [want] * (hi - lo)
