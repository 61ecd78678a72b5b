"""The frame header of the ring protocol, as Python sees it (mirror of csrc/sr_wire.h).

Every frame starts with 32 little-endian bytes:

    magic u32 "SRF1" | kind u8 (1 data, 2 ack, 3 heartbeat, 4 dead, 5 bye) | flags u8 | version u16 | src_rank u16 |
    dst_rank u16 | seq u64 | length u32 | payload_sum u32 | header_sum u32

DATA frames carry ``length`` payload bytes with sequence ``seq`` (monotonic per directed
link, from 0); an ACK carries in ``seq`` how many DATA frames the receiver has consumed. A
sender keeps at most ``window`` frames unacknowledged, so a receiver's slot is reused only
after its ack. The ack direction also carries HEARTBEAT frames (header only) and DEAD frames
(a 24-byte ``sr_dead`` verdict: dead rank, reporter, cage, code, address, silence, UTC time;
transport.liveness) and a BYE before a clean close (so that close is no verdict). Checksums are the engine's ``sr_checksum``; tests use this module to forge
frames and check that corruption and reordering are caught.
"""

from __future__ import annotations

import ctypes
import struct

from transport._native import engine

MAGIC = 0x31465253
VERSION = 3  # SR_WIRE_VERSION: 2 the eight-lane payload checksum, 3 heartbeats and verdicts
KIND_DATA = 1
KIND_ACK = 2
KIND_HEARTBEAT = 3
KIND_DEAD = 4
KIND_BYE = 5
DEAD = struct.Struct(
    "<HHHHIIQ"
)  # sr_dead: dead_rank, reporter, cage, code, addr (network order), silent_ms, at_ms
HEADER = struct.Struct("<IBBHHHQII")  # everything but header_sum (28 bytes)
HEADER_BYTES = HEADER.size + 4


def checksum(data: bytes) -> int:
    """The engine's checksum of ``data``."""
    buf = ctypes.create_string_buffer(data, len(data))
    return engine().sr_checksum(buf, len(data))


def frame(kind: int, src: int, dst: int, seq: int, payload: bytes = b"", *, magic: int = MAGIC) -> bytes:
    """A complete frame (header + payload) exactly as the engine would send it."""
    head = HEADER.pack(
        magic, kind, 0, VERSION, src, dst, seq, len(payload), checksum(payload) if payload else 0
    )
    return head + struct.pack("<I", checksum(head)) + payload
