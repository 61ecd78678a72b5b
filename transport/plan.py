"""Collective plans: a schedule (transport.schedule) laid out as engine steps over one arena.

The command ring's progress thread (csrc/sr_progress.c) runs a plan without Python: each
step is one engine call (up to four lanes, copy or add) or a copy inside the arena. The
steps are the host communicator's (transport.comm) step for step, so both paths produce
the same bytes; tests compare them. A plan depends only on (collective, rank, world, count,
dtype), never on where the arena lives, so it is built once per shape and replayed forever.

Arena layout: the input/result region at offset 0; an all-reduce's snapshot scratch (a
matching round sends the value it is adding into) after it, 256-byte aligned, unless the
fabric adds in place (it adds a frame only once that frame has left: the tcp engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from transport import schedule

COPY, ADD = 0, 1  # enum sr_op in csrc/sr_wire.h
STEP_LANES, STEP_COPY = 0, 1  # the step kinds of csrc/sr_progress.c
ALL_REDUCE, ALL_GATHER = 0, 1  # enum sr_plan_kind in csrc/sr_cmdring.h
ITEMSIZE = {0: 4, 1: 2, 2: 2}  # enum sr_dtype: f32, f16, bf16
# The progress thread counts completed commands per label (SR_MAX_LABELS of them); the flight
# recorder reports them under these names.
LABELS = ("all_reduce", "all_gather", "dcp_query_all_gather", "vocab_all_gather", "lse_combine")
ALIGN = 256


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Lane:
    """Send arena[soff:soff+slen] to rank ``to`` while receiving arena[roff:roff+rlen] from ``frm``."""

    to: int | None
    soff: int
    slen: int
    frm: int | None
    roff: int
    rlen: int


@dataclass(frozen=True)
class Step:
    """One engine call (``kind`` STEP_LANES, ``op`` COPY or ADD) or an arena copy (STEP_COPY:
    lanes[0].slen bytes from soff to roff)."""

    kind: int
    op: int
    lanes: tuple[Lane, ...]


@dataclass(frozen=True)
class Plan:
    """One collective of one shape on one rank, ready to register with the progress thread."""

    kind: int
    label: str
    code: int
    count: int
    in_off: int
    in_bytes: int
    out_off: int
    out_bytes: int
    arena_bytes: int
    steps: tuple[Step, ...]


def all_reduce(
    rank: int, world: int, count: int, code: int, algorithm: str = "auto", adds_in_place: bool = False
) -> Plan:
    """Sum of ``count`` elements of dtype ``code`` over the ring, in place at offset 0.

    ``adds_in_place``: the fabric's (``fabric.adds_in_place``); without it each matching round
    sends a snapshot, as the host communicator does.
    """
    isz = ITEMSIZE[code]
    nbytes = count * isz
    algo = schedule.allreduce_algorithm(world, nbytes, algorithm)
    steps: list[Step] = []
    arena = nbytes
    if algo in ("exchange", "matching"):
        send = 0 if adds_in_place else align(nbytes)
        arena = send + nbytes
        for peer in schedule.matching_peers(rank, world):
            if not adds_in_place:
                steps.append(Step(STEP_COPY, COPY, (Lane(None, 0, nbytes, None, send, nbytes),)))
            steps.append(Step(STEP_LANES, ADD, (Lane(peer, send, nbytes, peer, 0, nbytes),)))
    else:
        rings = []
        for d, (base, end) in zip(schedule.RING_DIRECTIONS, schedule.ring_halves(count), strict=True):
            to, frm = (rank + d) % world, (rank - d) % world
            bounds = schedule.chunk_bounds(end - base, world)
            rings.append((to, frm, base, bounds, schedule.ring_steps(rank, world, d)))
        for i in range(2 * (world - 1)):
            lanes = []
            for to, frm, base, bounds, ring in rings:
                (slo, shi), (rlo, rhi) = bounds[ring[i].send], bounds[ring[i].recv]
                lanes.append(
                    Lane(
                        to, (base + slo) * isz, (shi - slo) * isz, frm, (base + rlo) * isz, (rhi - rlo) * isz
                    )
                )
            steps.append(Step(STEP_LANES, ADD if rings[0][4][i].add else COPY, tuple(lanes)))
    return Plan(ALL_REDUCE, "all_reduce", code, count, 0, nbytes, 0, nbytes, arena, tuple(steps))


def all_gather(rank: int, world: int, count: int, code: int, label: str = "all_gather") -> Plan:
    """Every rank's ``count`` elements as ``world`` blocks in rank order; this rank's input is block ``rank``."""
    block = count * ITEMSIZE[code]
    steps: list[Step] = []
    if world in (2, 4):
        for peer, sent, got in schedule.gather_rounds(rank, world):
            lane = Lane(
                peer, sent.start * block, len(sent) * block, peer, got.start * block, len(got) * block
            )
            steps.append(Step(STEP_LANES, COPY, (lane,)))
    else:
        right, left = (rank + 1) % world, (rank - 1) % world
        for s in range(world - 1):
            send, recv = (rank - s) % world, (rank - s - 1) % world
            steps.append(
                Step(STEP_LANES, COPY, (Lane(right, send * block, block, left, recv * block, block),))
            )
    total = world * block
    return Plan(ALL_GATHER, label, code, count, rank * block, block, 0, total, total, tuple(steps))
