"""The tcp fabric: the engine's sequence/ack protocol over the two rendezvous sockets of a cable.

A link may have several connections each way (``connections``, the rendezvous' twins): the
engine then cuts a lane of at least ``stripe_min_bytes`` into one part per connection and moves
the parts at once, each on its own threads (one connection's copies, checksums and adds on one
core are what bounds a large message; docs/transport.md).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from transport._native import MAX_STRIPES, SrError, engine
from transport.liveness import Keeper, Liveness
from transport.rendezvous import Edge, EndpointRecord
from transport.topology import Port, RingSpec

# Four connections per link, a transfer cut over them from 1 MiB: on one H100's host (docs/transport.md,
# "Connections per link") this took the 4 MB and 64 MB all-reduces below NCCL-socket's at two ranks.
DEFAULT_CONNECTIONS = 4
DEFAULT_STRIPE_MIN_BYTES = 1 << 20


@dataclass
class Link:
    """A ring neighbour as the engine knows it (an sr_peer handle, and its stripes' handles)."""

    peer_rank: int
    address: str
    cage: int
    handle: ctypes.c_void_p
    stripes: list[ctypes.c_void_p] = field(default_factory=list)


class TcpFabric:
    """Data frames go out on the socket we dialed and come in on the one we accepted."""

    name = "tcp"
    # The engine adds a frame into a buffer it is also sending only once those bytes are sent,
    # so an exchange may send and add into the same buffer (no snapshot copy).
    adds_in_place = True
    connection_per_twin = True  # a twin is one more connection of the link

    def __init__(
        self,
        slot_bytes: int,
        window: int,
        connections: int = DEFAULT_CONNECTIONS,
        stripe_min_bytes: int = DEFAULT_STRIPE_MIN_BYTES,
    ) -> None:
        if not 1 <= connections <= MAX_STRIPES:
            raise ValueError(f"connections {connections}: a tcp link has 1 to {MAX_STRIPES}")
        if stripe_min_bytes < 1:
            raise ValueError(f"stripe_min_bytes {stripe_min_bytes} must be positive")
        self.slot_bytes, self.window = slot_bytes, window
        self.connections, self.stripe_min_bytes = connections, stripe_min_bytes
        self.lib = engine()
        self.transfer_lanes = self.lib.sr_transfer_lanes
        self.abort_peer = self.lib.sr_peer_abort  # a failed command ring closes its links with it

    def record(self, spec: RingSpec, port: Port, direction: str) -> list[EndpointRecord]:
        """One record per connection of the edge, on the port's address (its first twin)."""
        return [
            EndpointRecord(
                "tcp",
                spec.rank,
                port.peer_rank,
                spec.world,
                port.cage,
                self.slot_bytes,
                self.window,
                twin=twin,
                twins=self.connections,
            )
            for twin in range(self.connections)
        ]

    def open(self, spec: RingSpec, edges: list[Edge]) -> dict[int, Link]:
        links = {}
        for port in spec.ports:
            handles = [self._peer(spec, port, edges, twin) for twin in range(self.connections)]
            link = Link(port.peer_rank, port.peer_address, port.cage, handles[0], handles[1:])
            links[port.peer_rank] = link
            for stripe in link.stripes:
                err = SrError()
                if self.lib.sr_peer_stripe(link.handle, stripe, self.stripe_min_bytes, ctypes.byref(err)):
                    for handle in handles:
                        self.lib.sr_peer_free(handle, 0)
                    raise ValueError(err.message.decode(errors="replace"))
        return links

    def _peer(self, spec: RingSpec, port: Port, edges: list[Edge], twin: int) -> ctypes.c_void_p:
        """The engine's handle on one connection pair of a port (its tx and rx edges of ``twin``)."""
        tx, rx = (
            next(
                e.sock
                for e in edges
                if e.port == port and e.direction == d and e.peer_records[0].twin == twin
            )
            for d in ("tx", "rx")
        )
        handle = self.lib.sr_peer_new(
            spec.rank, port.peer_rank, tx.detach(), rx.detach(), self.slot_bytes, self.window
        )
        if not handle:
            raise ValueError(f"slot_bytes {self.slot_bytes} must be a positive multiple of 8, window >= 1")
        return ctypes.c_void_p(handle)

    def watch(self, links: list[Link], liveness: Liveness) -> Keeper:
        """The keeper thread over these links: heartbeats, dead-peer verdicts (transport.liveness)."""
        return Keeper(self.lib, links, liveness)

    def stats(self, link: Link) -> dict[str, int]:
        """The link's counters over all its connections; ``stripe_bytes_tx`` is the part of
        ``bytes_tx`` that its further connections carried."""
        per = []
        for handle in (link.handle, *link.stripes):
            out = (ctypes.c_uint64 * 6)()
            self.lib.sr_peer_stats(handle, ctypes.byref(out))
            per.append(list(out))
        keys = ("frames_tx", "frames_rx", "bytes_tx", "bytes_rx", "acks_tx", "acks_rx")
        totals = dict(zip(keys, (sum(column) for column in zip(*per, strict=True)), strict=True))
        return totals | {"stripe_bytes_tx": sum(counters[2] for counters in per[1:])}

    def close(self, link: Link, linger_s: float) -> None:
        """Close once the peer has acknowledged our frames (at most ``linger_s``), stripes first."""
        for handle in [*link.stripes, link.handle]:
            self.lib.sr_peer_free(handle, int(linger_s * 1000))
