"""The ring geometry (transport/geometry.py) on pairs and rings of 4 to 64, and its node copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from transport.geometry import (
    cable_between,
    cable_cage,
    matching_peers,
    matching_rounds,
    neighbours,
    ring_cables,
    world_size_problem,
)

ROOT = Path(__file__).resolve().parents[3]
RING_SIZES = (4, 6, 8, 10)


def test_the_module_utils_copy_is_the_same_file() -> None:
    """Ansible modules carry module_utils/sparkring_geometry.py to the nodes: it must not drift."""
    source = (ROOT / "transport" / "geometry.py").read_bytes()
    copy = (ROOT / "module_utils" / "sparkring_geometry.py").read_bytes()
    assert copy == source, "run: cp transport/geometry.py module_utils/sparkring_geometry.py"


@pytest.mark.parametrize("n", [2, *RING_SIZES, 12, 64])
def test_supported_world_sizes(n: int) -> None:
    assert world_size_problem(n) is None


@pytest.mark.parametrize("n", [0, 1, 3, 5, 7, 9])
def test_unsupported_world_sizes_say_what_is_expected(n: int) -> None:
    assert world_size_problem(n) == (
        f"expected 2 ranks (a pair on one cable) or an even number >= 4 (a ring), got {n}"
    )


def test_pair_is_one_cable_and_one_round() -> None:
    assert ring_cables(2) == [(0, 1)]
    assert neighbours(0, 2) == (1, 1)
    assert cable_cage(0, 2) is None
    assert [tuple(r) for r in matching_rounds(0, 2)] == [(0, 1, 0)]
    assert [tuple(r) for r in matching_rounds(1, 2)] == [(0, 0, 0)]


def test_four_ranks_round_zero_is_rank_xor_1_and_round_one_rank_xor_3() -> None:
    for rank in range(4):
        rounds = matching_rounds(rank, 4)
        assert [r.round for r in rounds] == [0, 1]
        assert rounds[0].peer == rank ^ 1
        assert rounds[1].peer == rank ^ 3


@pytest.mark.parametrize("n", RING_SIZES)
def test_rounds_are_the_two_perfect_matchings_of_the_ring(n: int) -> None:
    for k in (0, 1):
        pairs = {frozenset((rank, matching_rounds(rank, n)[k].peer)) for rank in range(n)}
        assert len(pairs) == n // 2, "every rank is in exactly one pair per round"
        for pair in pairs:
            a, b = sorted(pair)
            cable = cable_between(a, b, n)
            assert cable is not None and cable % 2 == k and cable_cage(cable, n) == k
    assert {matching_rounds(r, n)[0].peer for r in range(n)} == set(range(n))
    assert all(matching_rounds(r, n)[0].peer == r ^ 1 for r in range(n))


@pytest.mark.parametrize("n", RING_SIZES)
def test_cables_close_one_cycle(n: int) -> None:
    cables = ring_cables(n)
    assert cables == [(i, (i + 1) % n) for i in range(n)]
    for rank in range(n):
        left, right = neighbours(rank, n)
        assert cable_between(rank, right, n) == rank
        assert cable_between(left, rank, n) == left
    assert cable_between(0, 2, n) is None


@pytest.mark.parametrize("n", [2, *RING_SIZES])
def test_matching_peers_are_the_rounds_peers(n: int) -> None:
    for rank in range(n):
        assert matching_peers(rank, n) == [r.peer for r in matching_rounds(rank, n)]
    assert [matching_peers(r, 4) for r in range(4)] == [[1, 3], [0, 2], [3, 1], [2, 0]]
