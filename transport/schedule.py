"""Collective schedules: which neighbour each step talks to and which bytes it moves.

Pure functions, shared by the communicator and the numpy reference, so the order of every
reduction is defined in one place and every rank produces identical bytes:

* two-matching (4 ranks): round 0 adds with rank^1 (cage 0), round 1 with the other
  neighbour (rank^3 on four ranks, cage 1); result (a0+a1)+(a2+a3) on every rank.
* crossed matchings (4 ranks): the buffer's two halves (ring_halves) run the two matchings in
  opposite orders at once, so both cables carry half the bytes in each round where the
  two-matching leaves one idle: the first half (a0+a1)+(a2+a3), the second (a0+a3)+(a1+a2).
* exchange (2 ranks): one exchange-and-add; a0+a1 on both.
* ring (any even N): the buffer is split in two halves that run as two rings at once, the
  first clockwise (send right, receive left), the second counter-clockwise, so every cable
  carries data both ways. Each is a reduce-scatter then all-gather of N chunks; in the ring
  of direction d (+1 clockwise, -1 counter-clockwise) chunk c accumulates
  ((a_c + a_{c+d}) + a_{c+2d}) + ... and ends on rank c-d, which forwards it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.geometry import matching_peers

# Above this many bytes a 4-rank all-reduce uses the ring: using both directions of both
# cables it moves 0.75x the payload per link direction where the matchings move 2x over one
# cable at a time, but takes 6 dependent steps instead of 2, so it wins once
# 1.25 x size / bandwidth exceeds 4 step latencies (~4 MiB at 200 Gb/s, 50 us).
RING_THRESHOLD_BYTES = 4 << 20
RING_DIRECTIONS = (1, -1)  # the first half of the buffer goes clockwise, the second back


def allreduce_algorithm(world: int, nbytes: int, requested: str = "auto") -> str:
    """``exchange`` (2 ranks), ``matching`` (4 ranks, small) or ``ring``; ``crossed`` (4 ranks)
    when asked for."""
    if requested != "auto":
        if (requested == "exchange" and world != 2) or (requested in ("matching", "crossed") and world != 4):
            raise ValueError(f"all-reduce algorithm {requested!r} does not fit a ring of {world}")
        if requested not in ("exchange", "matching", "crossed", "ring"):
            raise ValueError(
                f"unknown all-reduce algorithm {requested!r}: auto, exchange, matching, crossed or ring"
            )
        return requested
    if world == 2:
        return "exchange"
    if world == 4 and nbytes <= RING_THRESHOLD_BYTES:
        return "matching"
    return "ring"


def chunk_bounds(count: int, world: int) -> list[tuple[int, int]]:
    """Element ranges [start, stop) of the N ring chunks; the first ``count % N`` get one more."""
    base, extra = divmod(count, world)
    bounds, start = [], 0
    for i in range(world):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_halves(count: int) -> list[tuple[int, int]]:
    """Element ranges of the two half-rings (RING_DIRECTIONS order); the first gets the odd one."""
    half = (count + 1) // 2
    return [(0, half), (half, count)]


@dataclass(frozen=True)
class RingStep:
    """One ring step: send chunk ``send`` to rank + direction, receive chunk ``recv`` from
    rank - direction (direction 1: right and left)."""

    send: int
    recv: int
    add: bool


def ring_steps(rank: int, world: int, direction: int = 1) -> list[RingStep]:
    """Reduce-scatter steps (add) then all-gather steps (copy) for ``rank`` in one direction."""
    d = direction
    rs = [RingStep((rank - d * s) % world, (rank - d * (s + 1)) % world, True) for s in range(world - 1)]
    ag = [RingStep((rank + d * (1 - s)) % world, (rank - d * s) % world, False) for s in range(world - 1)]
    return rs + ag


def matching_lanes(rank: int, world: int, count: int, algorithm: str) -> list[list[tuple[int, int, int]]]:
    """Per round of an exchange, two-matching or crossed matchings, the lanes of its one engine
    call as (peer, start, stop) element ranges: the whole buffer with the round's peer, or for
    the crossed matchings the first half over the matchings in order and the second in reverse."""
    peers = matching_peers(rank, world)
    if algorithm != "crossed":
        return [[(peer, 0, count)] for peer in peers]
    (a, b), (c, d) = ring_halves(count)
    return [[(peers[i], a, b), (peers[1 - i], c, d)] for i in range(2)]


def gather_rounds(rank: int, world: int) -> list[tuple[int, range, range]]:
    """Matching all-gather on 2 or 4 ranks: (peer, blocks sent, blocks received) per round."""
    peers = matching_peers(rank, world)
    rounds = [(peers[0], range(rank, rank + 1), range(peers[0], peers[0] + 1))]
    if world == 4:
        mine, theirs = rank - rank % 2, peers[1] - peers[1] % 2
        rounds.append((peers[1], range(mine, mine + 2), range(theirs, theirs + 2)))
    return rounds
