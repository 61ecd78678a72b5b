"""The tcp fabric: the engine's sequence/ack protocol over the two rendezvous sockets of a cable."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from transport._native import engine
from transport.liveness import Keeper, Liveness
from transport.rendezvous import Edge, EndpointRecord
from transport.topology import Port, RingSpec


@dataclass
class Link:
    """A ring neighbour as the engine knows it (an sr_peer handle)."""

    peer_rank: int
    address: str
    cage: int
    handle: ctypes.c_void_p


class TcpFabric:
    """Data frames go out on the socket we dialed and come in on the one we accepted."""

    name = "tcp"
    # The engine adds a frame into a buffer it is also sending only once those bytes are sent,
    # so an exchange may send and add into the same buffer (no snapshot copy).
    adds_in_place = True

    def __init__(self, slot_bytes: int, window: int) -> None:
        self.slot_bytes, self.window = slot_bytes, window
        self.lib = engine()
        self.transfer_lanes = self.lib.sr_transfer_lanes
        self.abort_peer = self.lib.sr_peer_abort  # a failed command ring closes its links with it

    def record(self, spec: RingSpec, port: Port, direction: str) -> list[EndpointRecord]:
        """One record per edge: tcp runs on the port's address, its first twin."""
        return [
            EndpointRecord(
                "tcp", spec.rank, port.peer_rank, spec.world, port.cage, self.slot_bytes, self.window
            )
        ]

    def open(self, spec: RingSpec, edges: list[Edge]) -> dict[int, Link]:
        links = {}
        for port in spec.ports:
            tx = next(e.sock for e in edges if e.port == port and e.direction == "tx")
            rx = next(e.sock for e in edges if e.port == port and e.direction == "rx")
            handle = self.lib.sr_peer_new(
                spec.rank, port.peer_rank, tx.detach(), rx.detach(), self.slot_bytes, self.window
            )
            if not handle:
                raise ValueError(
                    f"slot_bytes {self.slot_bytes} must be a positive multiple of 8, window >= 1"
                )
            links[port.peer_rank] = Link(
                port.peer_rank, port.peer_address, port.cage, ctypes.c_void_p(handle)
            )
        return links

    def watch(self, links: list[Link], liveness: Liveness) -> Keeper:
        """The keeper thread over these links: heartbeats, dead-peer verdicts (transport.liveness)."""
        return Keeper(self.lib, links, liveness)

    def stats(self, link: Link) -> dict[str, int]:
        out = (ctypes.c_uint64 * 6)()
        self.lib.sr_peer_stats(link.handle, ctypes.byref(out))
        keys = ("frames_tx", "frames_rx", "bytes_tx", "bytes_rx", "acks_tx", "acks_rx")
        return dict(zip(keys, out, strict=True))

    def close(self, link: Link, linger_s: float) -> None:
        """Close once the peer has acknowledged our frames (at most ``linger_s``)."""
        self.lib.sr_peer_free(link.handle, int(linger_s * 1000))
