"""The native engine's protocol: checksums, rounding, sequence/ack, corruption, bounds.

One side of each socket pair is an engine peer; the test writes or reads raw frames on
the other side (forged with transport.wire), so every rejection path runs for real.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading

import numpy as np
import pytest

from transport import reference, wire
from transport._native import MAX_LANES, SrError, SrLane, engine
from transport.buffers import BF16, F16, F32
from transport.errors import RendezvousError
from transport.rendezvous import RECORD_BYTES, EndpointRecord, check_record

SLOT = 64


class EnginePeer:
    """An engine peer for rank 1 talking to rank 0 over two socket pairs; the test holds rank 0's ends."""

    def __init__(self, window: int = 4) -> None:
        tx_engine, self.tx_far = socket.socketpair()
        rx_engine, self.rx_far = socket.socketpair()
        self.handle = engine().sr_peer_new(1, 0, tx_engine.detach(), rx_engine.detach(), SLOT, window)
        assert self.handle
        for far in (self.tx_far, self.rx_far):
            far.settimeout(5)  # a test that waits for a frame that never comes fails, never hangs

    def transfer(
        self, send: bytes = b"", recv_len: int = 0, op: int = 0, dtype: int = 0, timeout_ms: int = 2000
    ):
        sbuf = ctypes.create_string_buffer(send, len(send))
        rbuf = (ctypes.c_char * max(1, recv_len))()
        err = SrError()
        rc = engine().sr_transfer(
            self.handle if send else None,
            sbuf,
            len(send),
            self.handle if recv_len else None,
            rbuf,
            recv_len,
            op,
            dtype,
            timeout_ms,
            ctypes.byref(err),
        )
        return rc, err, bytes(rbuf)[:recv_len]

    def close(self) -> None:
        engine().sr_peer_free(self.handle, 0)
        self.tx_far.close()
        self.rx_far.close()


@pytest.fixture
def peer():
    p = EnginePeer()
    yield p
    p.close()


def read_frame(sock: socket.socket) -> tuple[tuple, bytes]:
    head = sock.recv(wire.HEADER_BYTES, socket.MSG_WAITALL)
    fields = wire.HEADER.unpack(head[:28])
    (header_sum,) = struct.unpack("<I", head[28:])
    assert header_sum == wire.checksum(head[:28])
    payload = sock.recv(fields[7], socket.MSG_WAITALL) if fields[7] else b""
    return fields, payload


def test_send_frames_sequence_and_checksums(peer: EnginePeer) -> None:
    data = bytes(range(256)) * 2  # 512 bytes -> 8 frames of 64
    rc, err, _ = peer.transfer(send=data[:256])
    assert rc == 0, err.message
    frames = [read_frame(peer.tx_far) for _ in range(4)]
    assert [f[0][7] for f in frames] == [64] * 4
    assert [f[0][6] for f in frames] == [0, 1, 2, 3]  # seq
    assert all(f[0][0] == wire.MAGIC and f[0][1] == wire.KIND_DATA and f[0][4] == 1 for f in frames)
    assert b"".join(f[1] for f in frames) == data[:256]
    assert all(f[0][8] == wire.checksum(f[1]) for f in frames)
    # The window (4) is full: without acks the next send must give up within its bound.
    rc, err, _ = peer.transfer(send=data[:64], timeout_ms=200)
    assert -rc == 1 and err.peer_rank == 0 and b"window full" in err.message
    # One ack for all four frames opens it again; seq keeps counting across calls.
    peer.tx_far.sendall(wire.frame(wire.KIND_ACK, 0, 1, 4))
    rc, err, _ = peer.transfer(send=data[:64])
    assert rc == 0, err.message
    assert read_frame(peer.tx_far)[0][6] == 4


def _lanes(handle, sends: list[bytes], recv_lens: list[int], op: int = 0, timeout_ms: int = 2000):
    """sr_transfer_lanes with lane i sending sends[i] to and receiving recv_lens[i] from ``handle``."""
    arr = (SrLane * len(sends))()
    sbufs = [ctypes.create_string_buffer(send, max(1, len(send))) for send in sends]
    rbufs = [(ctypes.c_char * max(1, n))() for n in recv_lens]
    for lane, sbuf, send, rbuf, n in zip(arr, sbufs, sends, rbufs, recv_lens, strict=True):
        lane.to, lane.sbuf, lane.slen = handle, ctypes.addressof(sbuf), len(send)
        lane.frm, lane.rbuf, lane.rlen = handle, ctypes.addressof(rbuf), n
    err = SrError()
    rc = engine().sr_transfer_lanes(arr, len(sends), op, 0, timeout_ms, ctypes.byref(err))
    return rc, err, [bytes(rbuf)[:n] for rbuf, n in zip(rbufs, recv_lens, strict=True)]


def test_lanes_sharing_a_peer_use_it_in_lane_order(peer: EnginePeer) -> None:
    # A two-rank ring moves both halves over its one cable: lane 0's frames go (and are
    # expected) first, lane 1's follow in the same sequence, in both directions.
    incoming = bytes(range(64, 256))
    for seq, lo in enumerate(range(0, 192, 64)):
        peer.rx_far.sendall(wire.frame(wire.KIND_DATA, 0, 1, seq, incoming[lo : lo + 64]))
    rc, err, got = _lanes(peer.handle, [b"a" * 128, b"b" * 128], [64, 128])
    assert rc == 0, err.message
    assert got == [incoming[:64], incoming[64:]]
    frames = [read_frame(peer.tx_far) for _ in range(4)]
    assert [(f[0][6], f[1]) for f in frames] == [
        (0, b"a" * 64),
        (1, b"a" * 64),
        (2, b"b" * 64),
        (3, b"b" * 64),
    ]
    acks = [read_frame(peer.rx_far)[0][6] for _ in range(3)]
    assert acks == [1, 2, 3]


def test_an_add_into_the_buffer_being_sent_waits_until_its_bytes_are_sent() -> None:
    # An exchange sends a buffer and adds the peer's into it: frame k may only be added once
    # frame k has left with the old bytes. All four incoming frames are there before the call
    # starts, but the window (2) lets the engine send frames 2 and 3 only after our acks.
    peer = EnginePeer(window=2)
    try:
        mine = np.arange(64, dtype=np.float32)
        original, theirs = mine.tobytes(), np.full(64, 1000, dtype=np.float32).tobytes()
        for seq in range(4):
            peer.rx_far.sendall(wire.frame(wire.KIND_DATA, 0, 1, seq, theirs[seq * SLOT : (seq + 1) * SLOT]))
        err, outcome = SrError(), []
        call = threading.Thread(
            target=lambda: outcome.append(
                engine().sr_transfer(
                    peer.handle,
                    mine.ctypes.data,
                    mine.nbytes,
                    peer.handle,
                    mine.ctypes.data,
                    mine.nbytes,
                    1,
                    F32,
                    5000,
                    ctypes.byref(err),
                )
            )
        )
        call.start()
        sent = []
        for seq in range(4):
            sent.append(read_frame(peer.tx_far)[1])
            peer.tx_far.sendall(wire.frame(wire.KIND_ACK, 0, 1, seq + 1))
        call.join(10)
        assert outcome == [0], err.message
        assert b"".join(sent) == original
        assert np.array_equal(mine, np.arange(64, dtype=np.float32) + 1000)
    finally:
        peer.close()


def test_a_corrupt_frame_ends_a_call_whose_sends_are_stuck(peer: EnginePeer) -> None:
    # Eight frames out and four in run on two threads; the sends stall on the window (no acks
    # come) while the receive finds frame 1 corrupt: the call reports the corruption.
    good = bytes(range(SLOT))
    peer.rx_far.sendall(
        wire.frame(wire.KIND_DATA, 0, 1, 0, good) + wire.frame(wire.KIND_DATA, 0, 1, 1, good)[:-1] + b"\x01"
    )
    rc, err, _ = peer.transfer(send=bytes(8 * SLOT), recv_len=4 * SLOT, timeout_ms=3000)
    assert -rc == 3 and b"corrupted payload in frame 1 from rank 0" in err.message and err.peer_rank == 0


@pytest.mark.parametrize("count", [0, MAX_LANES + 1])
def test_lane_count_is_bounded(peer: EnginePeer, count: int) -> None:
    arr = (SrLane * max(count, 1))()
    err = SrError()
    rc = engine().sr_transfer_lanes(arr, count, 0, 0, 100, ctypes.byref(err))
    assert -rc == 7 and b"invalid transfer arguments" in err.message


def test_ack_out_of_sequence_is_refused(peer: EnginePeer) -> None:
    assert peer.transfer(send=b"x" * 8)[0] == 0
    peer.tx_far.sendall(wire.frame(wire.KIND_ACK, 0, 1, 5))  # only one frame was sent
    rc, err, _ = peer.transfer(send=b"y" * 8)
    assert -rc == 4 and b"ack 5 from rank 0 out of sequence" in err.message


def test_receive_acks_each_frame_and_adds(peer: EnginePeer) -> None:
    a = np.arange(32, dtype=np.float32)
    for seq, lo in enumerate(range(0, 128, 64)):
        peer.rx_far.sendall(wire.frame(wire.KIND_DATA, 0, 1, seq, a.tobytes()[lo : lo + 64]))
    rc, err, got = peer.transfer(recv_len=128)
    assert rc == 0, err.message
    assert np.array_equal(np.frombuffer(got, np.float32), a)
    acks = [read_frame(peer.rx_far)[0] for _ in range(2)]
    assert [(f[1], f[6]) for f in acks] == [(wire.KIND_ACK, 1), (wire.KIND_ACK, 2)]


@pytest.mark.parametrize(
    ("forge", "code", "needle"),
    [
        (lambda p: wire.frame(wire.KIND_DATA, 0, 1, 1, p), 4, b"frame 1 from rank 0 out of sequence (expected 0)"),
        (lambda p: wire.frame(wire.KIND_DATA, 0, 1, 0, p, magic=0xDEADBEEF), 5, b"bad frame magic"),
        (lambda p: wire.frame(wire.KIND_DATA, 2, 1, 0, p), 5, b"unexpected frame from rank 0"),
        (lambda p: wire.frame(wire.KIND_DATA, 0, 1, 0, p[:32]), 5, b"has 32 bytes, expected 64"),
        (lambda p: wire.frame(wire.KIND_DATA, 0, 1, 0, p)[:-1] + b"\x01", 3, b"corrupted payload in frame 0"),
        (lambda p: wire.frame(wire.KIND_DATA, 0, 1, 0, p)[:12] + b"\x09" + wire.frame(1, 0, 1, 0, p)[13:], 3,
         b"corrupted frame header"),
    ],
)  # fmt: skip
def test_bad_frames_are_detected(peer: EnginePeer, forge, code: int, needle: bytes) -> None:
    peer.rx_far.sendall(forge(bytes(range(64))))
    rc, err, _ = peer.transfer(recv_len=64, timeout_ms=500)
    assert -rc == code, err.message
    assert needle in err.message and err.peer_rank == 0


def test_dead_and_silent_peers_are_bounded(peer: EnginePeer) -> None:
    rc, err, _ = peer.transfer(recv_len=64, timeout_ms=100)
    assert -rc == 1 and b"timed out after 100 ms waiting for data from rank 0" in err.message
    peer.rx_far.close()
    rc, err, _ = peer.transfer(recv_len=64, timeout_ms=5000)
    assert -rc == 2 and b"rank 0 closed the connection" in err.message


# The node's path (AVX2 + F16C on this machine) and the portable loops every other node runs.
REDUCERS = ("sr_reduce", "sr_reduce_portable")


def _reduce(reducer: str, d: np.ndarray, s: np.ndarray, code: int) -> np.ndarray:
    getattr(engine(), reducer)(d.ctypes.data, s.ctypes.data, d.nbytes, code)
    return d


def _addends(rng: np.random.Generator, special: list[float]) -> np.ndarray:
    """fp32 values of every magnitude, negative and positive, and the special ones."""
    spread = rng.standard_normal(40) * 10.0 ** rng.integers(-9, 6, 40)
    return np.concatenate([spread, special]).astype(np.float32)


def _bf16_library():
    """(fp32 -> bf16 bits, bf16 bits + bits -> (sum bits, not-NaN mask)) by torch, or where torch
    is not installed (the arm64 lane's root) by ml_dtypes: a reference the engine did not write."""
    try:
        import torch
    except ImportError:
        bf16 = pytest.importorskip(
            "ml_dtypes", reason="neither torch nor ml_dtypes for a bf16 reference"
        ).bfloat16

        def ml_add(d: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            total = d.view(bf16) + s.view(bf16)
            return total.view(np.uint16), ~np.isnan(total.astype(np.float32))

        return lambda x: x.astype(bf16).view(np.uint16), ml_add

    def as_torch(x: np.ndarray):
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)

    def torch_add(d: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = as_torch(d) + as_torch(s)
        return total.view(torch.int16).numpy().view(np.uint16), ~torch.isnan(total).numpy()

    return lambda x: torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16), torch_add


@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow to inf and inf - inf are cases
def test_half_precision_adds_round_like_numpy_and_torch(reducer: str) -> None:
    # Every bit pattern as the accumulator, each against ~50 addends: 3.4M sums per dtype, an
    # odd count so the vector loops' tails run too. A sum of two NaNs is its own test below.
    rng = np.random.default_rng(7)
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    special = [0, -0.0, 6e-8, -6e-8, 6.1e-5, 65504, -65504, 7e4, np.inf, -np.inf, np.nan, 3.0e38]
    # fp16: engine vs numpy (widen, add in fp32, round once)
    addends = _addends(rng, special).astype(np.float16).view(np.uint16)
    d, s = np.tile(every, len(addends))[:-1], np.repeat(addends, 65536)[:-1]
    want = (d.view(np.float16).astype(np.float32) + s.view(np.float16).astype(np.float32)).astype(np.float16)
    got = _reduce(reducer, d.copy(), s, F16)
    d_nan, s_nan = np.isnan(d.view(np.float16)), np.isnan(s.view(np.float16))
    made = np.isnan(want) & ~d_nan & ~s_nan  # inf + -inf: the CPU's NaN (Arm's differs from x86's)
    assert np.array_equal(got[made], np.full(made.sum(), 0xFE00, np.uint16))  # SR_NAN_MADE as fp16
    keep = ~(d_nan & s_nan) & ~made
    assert np.array_equal(got[keep], want.view(np.uint16)[keep])
    # bf16: engine vs a library's own bf16 add (torch writes every NaN as one canonical NaN)
    to_bf16, bf16_add = _bf16_library()
    addends = to_bf16(_addends(rng, special))
    d, s = np.tile(every, len(addends))[:-1], np.repeat(addends, 65536)[:-1]
    want, finite = bf16_add(d, s)
    got = _reduce(reducer, d.copy(), s, BF16)
    assert np.array_equal(got[finite], want[finite])
    # fp32: IEEE addition, exactly numpy's
    a, b = (rng.standard_normal(100_003).astype(np.float32) * 1e3 for _ in range(2))
    assert np.array_equal(_reduce(reducer, a.copy(), b, F32), a + b)


@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy warns when the reference adds signalling NaNs
def test_a_sum_of_two_nans_is_the_same_on_both_ends(reducer: str) -> None:
    # Hardware returns one operand's NaN and the two ends of an exchange add in opposite
    # orders; the engine returns the larger of the two quieted NaNs, so both ends agree.
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f32_nans = (np.random.default_rng(5).integers(1, 1 << 22, 600, dtype=np.uint32) | 0x7F800000) ^ (
        np.arange(600, dtype=np.uint32) % 2 << 31
    )  # signalling payloads of both signs
    cases = [
        (F16, halves[np.isnan(halves.view(np.float16))], 0x0200, np.float16),
        (BF16, halves[((halves & 0x7F80) == 0x7F80) & ((halves & 0x7F) != 0)], 0x0040, np.uint16),
        (F32, f32_nans, 0x00400000, np.float32),
    ]
    for code, nans, quiet, dtype in cases:
        a, b = np.repeat(nans, len(nans)), np.tile(nans, len(nans))
        ab, ba = _reduce(reducer, a.copy(), b, code), _reduce(reducer, b.copy(), a, code)
        assert np.array_equal(ab, ba)
        assert np.array_equal(ab, np.maximum(a | quiet, b | quiet))
        assert np.array_equal(ab, reference.add(a.view(dtype), b.view(dtype), code).view(ab.dtype))


def test_checksum_sees_every_single_bit_flip() -> None:
    data = bytearray(np.random.default_rng(3).integers(0, 256, 333, dtype=np.uint8).tobytes())
    base = wire.checksum(bytes(data))
    for bit in range(0, len(data) * 8, 7):
        data[bit // 8] ^= 1 << (bit % 8)
        assert wire.checksum(bytes(data)) != base
        data[bit // 8] ^= 1 << (bit % 8)


def _portable_checksum(data: bytes) -> int:
    buf = ctypes.create_string_buffer(data, len(data))
    return engine().sr_checksum_portable(buf, len(data))


def test_checksum_sees_moved_words_and_zeros_and_both_paths_agree() -> None:
    rng = np.random.default_rng(11)
    data = rng.integers(0, 256, 4096 + 37, dtype=np.uint8).tobytes()
    base = wire.checksum(data)
    words = np.frombuffer(data[:4096], dtype=np.uint64).copy()
    for i, j in ((0, 1), (0, 8), (3, 500), (7, 511)):  # within a stripe, across stripes
        moved = words.copy()
        moved[[i, j]] = moved[[j, i]]
        assert wire.checksum(moved.tobytes() + data[4096:]) != base
    assert wire.checksum(data + bytes(1)) != base and wire.checksum(data + bytes(64)) != base
    assert wire.checksum(bytes(64)) != wire.checksum(bytes(128)) != wire.checksum(b"")
    # The AVX2 loop this machine runs and the portable one every other node runs: same values.
    for n in [*range(0, 300), 1 << 18, (1 << 18) + 5]:
        chunk = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert wire.checksum(chunk) == _portable_checksum(chunk), n
    assert engine().sr_abi_version() == wire.VERSION


def test_endpoint_record_round_trip_and_refusals() -> None:
    rec = EndpointRecord(
        "verbs",
        0,
        1,
        4,
        0,
        262144,
        8,
        qpn=0x11,
        psn=0x22,
        rkey=0x33,
        addr=1 << 40,
        size=1 << 21,
        gid=bytes(10) + b"\xff\xff" + bytes([198, 19, 0, 1]),
        twin=1,
        twins=2,
    )
    raw = rec.pack()
    assert len(raw) == RECORD_BYTES
    assert EndpointRecord.unpack(raw, "rank 0") == rec
    with pytest.raises(RendezvousError, match="rank 0: endpoint record checksum mismatch"):
        EndpointRecord.unpack(raw[:20] + bytes([raw[20] ^ 0xFF]) + raw[21:], "rank 0")
    with pytest.raises(RendezvousError, match="not a SparkRing endpoint"):
        EndpointRecord.unpack(b"HTTP" + raw[4:], "rank 0")
    with pytest.raises(RendezvousError, match=r"rank 0 at 10.0.0.1: endpoint record window=8, expected 16"):
        check_record(
            rec, EndpointRecord("verbs", 0, 1, 4, 0, 262144, 16, twin=1, twins=2), "rank 0 at 10.0.0.1"
        )
    # Both ends of a cable must stripe over as many twins (the inventory says so; a node may not).
    with pytest.raises(RendezvousError, match=r"endpoint record twins=2, expected 1"):
        check_record(rec, EndpointRecord("verbs", 0, 1, 4, 0, 262144, 8), "rank 0 at 10.0.0.1")
