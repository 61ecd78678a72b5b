"""Pipelined plans (transport.plan.pipelined): the GPU copies a large all-reduce in and out in
chunks while the wire runs, so every piece must wait for the input it touches and announce only
result chunks that nothing later writes; and the pieces must move exactly the original bytes."""

from __future__ import annotations

import pytest

from transport import plan as plans


def _cover(step: plans.Step) -> list[tuple]:
    """(peer, direction, lo, hi) byte ranges a LANES step moves, in lane order."""
    out = []
    for ln in step.lanes:
        if ln.to is not None and ln.slen:
            out.append((ln.to, "send", ln.soff, ln.soff + ln.slen))
        if ln.frm is not None and ln.rlen:
            out.append((ln.frm, "recv", ln.roff, ln.roff + ln.rlen))
    return out


def _merge(ranges: list[tuple]) -> dict:
    """Per (peer, direction): the byte ranges, consecutive pieces joined."""
    merged: dict = {}
    for peer, d, lo, hi in ranges:
        spans = merged.setdefault((peer, d), [])
        if spans and spans[-1][1] == lo:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return merged


CASES = [
    (2, n, code, "auto", c)
    for n in (4097, 2**20 + 3, 3 << 20)
    for code in (0, 1)
    for c in (64 << 10, 1 << 20)
]
CASES += [
    (4, n, 1, a, c) for n in (2**20 + 3, 9 << 20) for a in ("auto", "ring") for c in (256 << 10, 1 << 20)
]


@pytest.mark.parametrize(("world", "count", "code", "algorithm", "chunk"), CASES)
@pytest.mark.parametrize("in_place", [True, False])
def test_pieces_move_the_same_bytes_and_gate_on_chunks(world, count, code, algorithm, chunk, in_place):
    for rank in range(world):
        whole = plans.all_reduce(rank, world, count, code, algorithm, in_place)
        piped = plans.pipelined(whole, chunk)
        assert piped.chunk == chunk and (piped.in_off, piped.out_bytes) == (whole.in_off, whole.out_bytes)
        # Same bytes over each link, in the same order, same ops: per original step, the pieces.
        it = iter(piped.steps)
        for step in whole.steps:
            if step.kind == plans.STEP_COPY:
                assert next(it).lanes == step.lanes
                continue
            want = _merge(_cover(step))
            got: list[tuple] = []
            while sum(hi - lo for spans in _merge(got).values() for lo, hi in spans) < sum(
                hi - lo for spans in want.values() for lo, hi in spans
            ):
                piece = next(it)
                assert piece.op == step.op and all(max(ln.slen, ln.rlen) <= chunk for ln in piece.lanes)
                got += _cover(piece)
            assert _merge(got) == want
        assert next(it, None) is None
        # Gates: a piece touches only input chunks already announced; an announced result chunk
        # is never written again; in the end every chunk was waited for and announced.
        k_in = -(-whole.in_bytes // chunk)
        need = ready = 0
        for i, step in enumerate(piped.steps):
            need = max(need, step.need_in)
            for ln in step.lanes:
                for lo, ln_len, written in (
                    (ln.soff, ln.slen, False),
                    (ln.roff, ln.rlen if step.kind == plans.STEP_LANES else ln.slen, True),
                ):
                    if ln_len and lo < whole.in_bytes:
                        assert (min(lo + ln_len, whole.in_bytes) - 1) // chunk < need, (rank, i)
                    if written and ln_len and lo < whole.out_bytes:
                        assert lo // chunk >= ready, (rank, i, lo, ready)
            assert step.out_ready == 0 or step.out_ready > ready
            ready = max(ready, step.out_ready)
        assert need == k_in and ready == -(-whole.out_bytes // chunk)


def test_pipeline_chunks_are_frames_and_at_most_sixteen():
    assert plans.pipeline_chunk(4 << 20) == 1 << 20
    assert plans.pipeline_chunk(64 << 20) == 4 << 20
    for n in (1 << 20, 5 << 20, 100 << 20, (64 << 20) + 2):
        c = plans.pipeline_chunk(n)
        assert c % (256 << 10) == 0 and -(-n // c) <= 16


def test_a_chunk_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        plans.pipelined(plans.all_reduce(0, 2, 1024, 0), 0)
