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

from dataclasses import dataclass, replace

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
    lanes[0].slen bytes from soff to roff). In a pipelined plan the step first waits for the
    input's first ``need_in`` chunks and then announces the result's first ``out_ready``
    (0: neither)."""

    kind: int
    op: int
    lanes: tuple[Lane, ...]
    need_in: int = 0
    out_ready: int = 0


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
    chunk: int = 0  # pipelined: the producer's copies move this many bytes at a time (0: whole)


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
    if algo in ("exchange", "matching", "crossed"):
        send = 0 if adds_in_place else align(nbytes)
        arena = send + nbytes
        for halves in schedule.matching_lanes(rank, world, count, algo):
            if not adds_in_place:
                steps.append(Step(STEP_COPY, COPY, (Lane(None, 0, nbytes, None, send, nbytes),)))
            lanes = tuple(
                Lane(peer, send + lo * isz, (hi - lo) * isz, peer, lo * isz, (hi - lo) * isz)
                for peer, lo, hi in halves
            )
            steps.append(Step(STEP_LANES, ADD, lanes))
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


def pipeline_chunk(nbytes: int) -> int:
    """The copy chunk for a pipelined collective of ``nbytes``: at least 1 MiB, at most 16 chunks,
    a multiple of the engine's 256 KiB frame so the pieces cut the same frames as the whole."""
    frame = 256 << 10
    return max(1 << 20, -(-nbytes // 16 // frame) * frame)


def pipelined(p: Plan, chunk: int) -> Plan:
    """``p`` with its copies in and out overlapped with the wire, chunk by chunk.

    The producer copies the input into the arena ``chunk`` bytes at a time and announces each
    (in_ready); the result leaves the same way as soon as it is final (out_ready). So each
    step is cut into pieces of at most ``chunk`` bytes per lane (piece j of every lane in one
    engine call, lanes in their order: both ends of a link cut the same lengths the same way,
    so the frames are the same ones in the same order, and every element sees the same adds
    in the same order as in ``p``). Each piece waits for the input chunks it touches (a copy
    received into a chunk the producer has not written yet would be overwritten) and then
    announces the result chunks that no later piece writes.
    """
    if chunk <= 0:
        raise ValueError("pipeline chunk must be positive")
    pieces: list[Step] = []
    for step in p.steps:
        if step.kind == STEP_COPY:
            pieces.append(step)
            continue
        n = max(-(-max(ln.slen, ln.rlen) // chunk) for ln in step.lanes)
        for j in range(n):
            lanes = []
            for ln in step.lanes:
                s0, s1 = min(j * chunk, ln.slen), min((j + 1) * chunk, ln.slen)
                r0, r1 = min(j * chunk, ln.rlen), min((j + 1) * chunk, ln.rlen)
                if s1 > s0 or r1 > r0:
                    lanes.append(
                        Lane(
                            ln.to if s1 > s0 else None,
                            ln.soff + s0,
                            s1 - s0,
                            ln.frm if r1 > r0 else None,
                            ln.roff + r0,
                            r1 - r0,
                        )
                    )
            pieces.append(Step(step.kind, step.op, tuple(lanes)))

    def chunks(lo: int, hi: int, base: int, size: int) -> range:
        """The chunks of the region [base, base + size) that bytes [lo, hi) touch."""
        lo, hi = max(lo, base), min(hi, base + size)
        return range((lo - base) // chunk, -(-(hi - base) // chunk)) if hi > lo else range(0)

    def touched(step: Step) -> list[tuple[int, int, bool]]:
        """(lo, hi, written) arena ranges of a step."""
        if step.kind == STEP_COPY:
            ln = step.lanes[0]
            return [(ln.soff, ln.soff + ln.slen, False), (ln.roff, ln.roff + ln.slen, True)]
        return [
            r
            for ln in step.lanes
            for r in ((ln.soff, ln.soff + ln.slen, False), (ln.roff, ln.roff + ln.rlen, True))
        ]

    n_out = -(-p.out_bytes // chunk)
    last_write = [-1] * n_out
    for i, step in enumerate(pieces):
        for lo, hi, written in touched(step):
            if written:
                for k in chunks(lo, hi, p.out_off, p.out_bytes):
                    last_write[k] = i
    steps, need, ready = [], 0, 0
    for i, step in enumerate(pieces):
        want = max(
            (k + 1 for lo, hi, _ in touched(step) for k in chunks(lo, hi, p.in_off, p.in_bytes)), default=0
        )
        need_in = want if want > need else 0
        need = max(need, want)
        final = ready
        while final < n_out and last_write[final] <= i:
            final += 1
        steps.append(Step(step.kind, step.op, step.lanes, need_in, final if final > ready else 0))
        ready = final
    if ready < n_out or need < -(-p.in_bytes // chunk):
        raise ValueError(f"{p.label}: a pipelined plan must read all its input and finish all its result")
    return replace(p, steps=tuple(steps), chunk=chunk)
