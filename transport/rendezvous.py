"""Rendezvous: one TCP control channel per directed ring edge, carrying endpoint records.

Each rank listens on every port address and dials every neighbour from that port's
address, so setup traffic takes the same cable as the data. On each directed edge the
dialer (the sender of the data) sends its records and the listener (the receiver) answers
with its own: one record per twin of the port (a Spark cage is two RDMA functions and the
verbs fabric stripes over both). The tcp fabric's twins are its connections per link: each
record then goes on a connection of its own, which becomes that twin's data connection. A record is versioned and checksummed; any
mismatch (wrong rank, world, fabric, window, slot size, twin count, version, a connection
from the wrong address) is a RendezvousError naming the peer, and the peer sees the channel
close.

Record layout (little-endian, 89 bytes): magic "SRE1", version u16, fabric u8, twin u8,
twins u8, src_rank u16, dst_rank u16, world u16, cage u16, qpn u32, psn u32, rkey u32,
addr u64, size u64, slot_bytes u32, window u32, gid 16 B, crc32 u32 of the rest.
"""

from __future__ import annotations

import errno
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from transport.errors import RendezvousError
from transport.topology import Port, RingSpec

MAGIC = b"SRE1"
VERSION = 2  # 2: one record per twin (twin, twins)
FABRICS = {"tcp": 0, "verbs": 1}
_BODY = struct.Struct("<4sHBBBHHHHIIIQQII16s")
RECORD_BYTES = _BODY.size + 4


@dataclass(frozen=True)
class EndpointRecord:
    """What one end of a directed edge tells the other."""

    fabric: str
    src_rank: int
    dst_rank: int
    world: int
    cage: int
    slot_bytes: int
    window: int
    qpn: int = 0
    psn: int = 0
    rkey: int = 0
    addr: int = 0
    size: int = 0
    gid: bytes = bytes(16)
    twin: int = 0
    twins: int = 1
    version: int = VERSION

    def pack(self) -> bytes:
        body = _BODY.pack(
            MAGIC,
            self.version,
            FABRICS[self.fabric],
            self.twin,
            self.twins,
            self.src_rank,
            self.dst_rank,
            self.world,
            self.cage,
            self.qpn,
            self.psn,
            self.rkey,
            self.addr,
            self.size,
            self.slot_bytes,
            self.window,
            self.gid,
        )
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def unpack(cls, data: bytes, peer: str) -> EndpointRecord:
        if len(data) != RECORD_BYTES:
            raise RendezvousError(f"{peer}: endpoint record of {len(data)} bytes, expected {RECORD_BYTES}")
        body, (crc,) = data[:-4], struct.unpack("<I", data[-4:])
        magic, version, fabric, twin, twins, *rest = _BODY.unpack(body)
        if magic != MAGIC:
            raise RendezvousError(
                f"{peer}: not a SparkRing endpoint (magic {magic!r}); is another service on the port?"
            )
        if zlib.crc32(body) != crc:
            raise RendezvousError(f"{peer}: endpoint record checksum mismatch (corrupted control channel)")
        if version != VERSION:
            raise RendezvousError(
                f"{peer}: endpoint record version {version}, this node speaks {VERSION}: upgrade both"
            )
        names = {v: k for k, v in FABRICS.items()}
        if fabric not in names:
            raise RendezvousError(f"{peer}: unknown fabric code {fabric}")
        src, dst, world, cage, qpn, psn, rkey, addr, size, slot, window, gid = rest
        return cls(
            names[fabric],
            src,
            dst,
            world,
            cage,
            slot,
            window,
            qpn,
            psn,
            rkey,
            addr,
            size,
            gid,
            twin,
            twins,
            version,
        )


def check_record(got: EndpointRecord, want: EndpointRecord, peer: str) -> None:
    """Refuse a peer record that disagrees with what this rank expects of it."""
    for field in ("fabric", "src_rank", "dst_rank", "world", "cage", "slot_bytes", "window", "twins", "twin"):
        if getattr(got, field) != getattr(want, field):
            raise RendezvousError(
                f"{peer}: endpoint record {field}={getattr(got, field)!r}, expected {getattr(want, field)!r}; "
                "both ends must run the same transport settings on a correctly cabled ring",
                peer_rank=want.src_rank,
            )


@dataclass
class Edge:
    """One directed edge after rendezvous: ``tx`` (we send data) or ``rx`` (we receive).

    ``peer_records`` holds the peer's record of each twin, in twin order.
    """

    port: Port
    direction: str
    sock: socket.socket
    peer_records: list[EndpointRecord]


def _recv_exact(sock: socket.socket, n: int, peer: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError as exc:
            raise RendezvousError(f"{peer}: no endpoint record within the setup bound") from exc
        except OSError as exc:
            raise RendezvousError(f"{peer}: control channel failed: {exc}") from exc
        if not chunk:
            raise RendezvousError(
                f"{peer}: closed the control channel (it rejected our record; see its error)"
            )
        buf += chunk
    return bytes(buf)


def _dial(port: Port, tcp_port: int, deadline: float, peer: str) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((port.address, 0))
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect((port.peer_address, tcp_port))
            return sock
        except OSError as exc:
            sock.close()
            retry = exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ENETUNREACH)
            if not retry or time.monotonic() >= deadline:
                raise RendezvousError(
                    f"{peer}: cannot connect from {port.address}: {exc}", port.peer_rank
                ) from exc
            time.sleep(0.05)


def rendezvous(
    spec: RingSpec,
    tcp_port: int,
    timeout_s: float,
    local_records: Callable[[Port, str], list[EndpointRecord]],
    connection_per_twin: bool = False,
) -> list[Edge]:
    """Connect both directed edges of every port and exchange endpoint records.

    ``local_records(port, direction)`` gives this rank's records for an edge, one per twin;
    each record of the peer must equal ours of its twin with src/dst swapped in the checked
    fields. With ``connection_per_twin`` each twin's record goes on its own connection, and
    the edge list has an Edge per connection, each holding its twin's record.
    """
    deadline = time.monotonic() + timeout_s
    listeners: dict[int, socket.socket] = {}
    edges: list[Edge] = []
    dialed: list[tuple[Port, socket.socket, str, list[EndpointRecord]]] = []
    try:
        for port in spec.ports:
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                lsock.bind((port.address, tcp_port))
            except OSError as exc:
                lsock.close()
                raise RendezvousError(
                    f"cannot listen on {port.address}:{tcp_port} (cage {port.cage}): {exc}; "
                    "is the address configured on this node and the port free?"
                ) from exc
            lsock.listen(4)
            listeners[port.cage] = lsock
        # Dial and send first, then accept and answer, then read answers: the kernel buffers
        # every record, so no ordering between ranks can deadlock.
        for port in spec.ports:
            peer = f"rank {port.peer_rank} at {port.peer_address}"
            for records in _per_connection(local_records(port, "tx"), connection_per_twin):
                sock = _dial(port, tcp_port, deadline, peer)
                dialed.append((port, sock, peer, records))
                sock.sendall(b"".join(record.pack() for record in records))
        for port in spec.ports:
            peer = f"rank {port.peer_rank} at {port.peer_address}"
            mine = local_records(port, "rx")
            seen: set[int] = set()
            for _ in _per_connection(mine, connection_per_twin):
                sock = _accept(listeners[port.cage], port, tcp_port, deadline, peer)
                try:
                    ours, got = _answer(sock, mine, connection_per_twin, seen, peer)
                    sock.sendall(b"".join(record.pack() for record in ours))
                except BaseException:
                    sock.close()
                    raise
                edges.append(Edge(port, "rx", sock, got))
        for port, sock, peer, records in dialed:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            edges.append(Edge(port, "tx", sock, _receive_records(sock, records, peer)))
    except BaseException:
        for edge in edges:
            edge.sock.close()
        for _, sock, _, _ in dialed:
            sock.close()
        raise
    finally:
        for lsock in listeners.values():
            lsock.close()
    return edges


def _per_connection(records: list[EndpointRecord], connection_per_twin: bool) -> list[list[EndpointRecord]]:
    """The records each connection of an edge carries: one twin's each, or all on one."""
    return [[record] for record in records] if connection_per_twin else [records]


def _answer(
    sock: socket.socket, mine: list[EndpointRecord], connection_per_twin: bool, seen: set[int], peer: str
) -> tuple[list[EndpointRecord], list[EndpointRecord]]:
    """(our records to answer with, the peer's) on an accepted connection. One twin per
    connection: the peer's record says which twin it is, and each twin comes once."""
    if not connection_per_twin:
        return mine, _receive_records(sock, mine, peer)
    theirs = EndpointRecord.unpack(_recv_exact(sock, RECORD_BYTES, peer), peer)
    if theirs.twin in seen:
        raise RendezvousError(f"{peer}: twin {theirs.twin} connected twice", peer_rank=mine[0].dst_rank)
    ours = mine[theirs.twin] if theirs.twin < len(mine) else mine[0]  # out of range: refused below
    check_record(theirs, _as_peer(ours), peer)
    seen.add(theirs.twin)
    return [ours], [theirs]


def _accept(lsock: socket.socket, port: Port, tcp_port: int, deadline: float, peer: str) -> socket.socket:
    """The next connection from the cable's other end (any other address is closed)."""
    while True:
        lsock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock, (src, _) = lsock.accept()
        except TimeoutError as exc:
            raise RendezvousError(
                f"{peer}: never connected to {port.address}:{tcp_port}", port.peer_rank
            ) from exc
        if src == port.peer_address:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            return sock
        sock.close()  # only the cable's other end may connect here


def _receive_records(sock: socket.socket, mine: list[EndpointRecord], peer: str) -> list[EndpointRecord]:
    """The peer's record of each of our twins, each checked as it arrives (a twin count that
    differs fails on the first record, before waiting for more)."""
    got = []
    for record in mine:
        theirs = EndpointRecord.unpack(_recv_exact(sock, RECORD_BYTES, peer), peer)
        check_record(theirs, _as_peer(record), peer)
        got.append(theirs)
    return got


def _as_peer(mine: EndpointRecord) -> EndpointRecord:
    """The record we expect from the other end: our own with the ranks swapped."""
    return replace(mine, src_rank=mine.dst_rank, dst_rank=mine.src_rank)
