"""Ring geometry: which ranks share a cable, which cage it uses, the two matching rounds.

The one definition of the ring's shape (standard library only). The inventory schema, its
hostvars, the transport's schedules, the overlay and the image fan-out all derive from it.
`module_utils/sparkring_geometry.py` is a byte-for-byte copy that travels to the nodes inside
Ansible modules; tests/unit/transport/test_geometry.py keeps the two equal.

Cable i joins rank i and rank (i + 1) % n; a pair (n = 2) has one cable. Cable i sits in cage
i % 2 on both of its ends (cage matching): the cables then split into two perfect matchings,
and round k of a collective drives cage k on every rank at once.
"""

from __future__ import annotations

from typing import NamedTuple


class Round(NamedTuple):
    """One exchange round of a rank: the peer it pairs with and the cable they share."""

    round: int
    peer: int
    cable: int


def world_size_problem(n: int) -> str | None:
    """Why `n` ranks cannot form a supported ring (None when they can).

    A pair shares one cable; a ring needs an even size so that its cables split into the two
    perfect matchings the collectives run as rounds.
    """
    if n == 2 or (n >= 4 and n % 2 == 0):
        return None
    return f"expected 2 ranks (a pair on one cable) or an even number >= 4 (a ring), got {n}"


def ring_cables(n: int) -> list[tuple[int, int]]:
    """The ends of every cable, by cable index: (i, i + 1 mod n); a pair has one cable."""
    return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]


def cable_between(a: int, b: int, n: int) -> int | None:
    """The index of the cable joining ranks `a` and `b`, or None when they are not neighbours."""
    for index, ends in enumerate(ring_cables(n)):
        if {a, b} == set(ends):
            return index
    return None


def neighbours(rank: int, n: int) -> tuple[int, int]:
    """(left, right): rank - 1 and rank + 1 around the ring; on a pair both are the peer."""
    return (rank - 1) % n, (rank + 1) % n


def cable_cage(cable: int, n: int) -> int | None:
    """The cage a cable uses on both ends: cable i in cage i % 2; a pair has no matching to keep."""
    return None if n == 2 else cable % 2


def matching_rounds(rank: int, n: int) -> list[Round]:
    """The rounds of `rank`: round k runs over its cable of parity k.

    Round 0 is the (2k, 2k+1) matching (peer rank ^ 1), round 1 the other neighbour (on four
    ranks rank ^ 3). A pair has a single round over its one cable.
    """
    if n == 2:
        return [Round(0, 1 - rank, 0)]
    left, right = neighbours(rank, n)
    return sorted(Round(cable % 2, peer, cable) for peer, cable in ((right, rank), (left, left)))


def matching_peers(rank: int, n: int) -> list[int]:
    """The peer of each matching round, in round order."""
    return [r.peer for r in matching_rounds(rank, n)]
