"""The frame header of the ring protocol, as Python sees it (mirror of csrc/sr_wire.h).

Every frame starts with 32 little-endian bytes:

    magic u32 "SRF1" | kind u8 (1 data, 2 ack) | flags u8 | version u16 | src_rank u16 |
    dst_rank u16 | seq u64 | length u32 | payload_sum u32 | header_sum u32

DATA frames carry ``length`` payload bytes with sequence ``seq`` (monotonic per directed
link, from 0); an ACK carries in ``seq`` how many DATA frames the receiver has consumed. A
sender keeps at most ``window`` frames unacknowledged, so a receiver's slot is reused only
after its ack. Checksums are the engine's ``sr_checksum``; tests use this module to forge
frames and check that corruption and reordering are caught.
"""

from __future__ import annotations

import ctypes
import struct

from transport._native import engine

MAGIC = 0x31465253
VERSION = 2  # SR_WIRE_VERSION: 2 is the eight-lane payload checksum
KIND_DATA = 1
KIND_ACK = 2
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
