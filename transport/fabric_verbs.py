"""The verbs fabric: per neighbour, per twin of the cable, one registered arena and two RC QPs.

A ring port is one cage, and a Spark cage is two x4 RDMA functions ("twins") of ~100 Gb/s
each: only both carry the cable's rate. So every neighbour is a link over its port's twins
(transport.topology.Twin): the first twin addresses the peer by the port address's IPv4-mapped
RoCE v2 GID, another twin by its link-local RoCE v2 GID, and twin t talks to the peer's twin t.
The engine (csrc/sr_verbs.c) stripes frames over them in order.

Setup order, per twin: open its device and check it (active, the GID its role needs), allocate
and register the arena, create the completion channel, the CQ and both QPs in INIT. Then
exchange endpoint records over the rendezvous channel (one per twin: QPN, PSN, GID; the rx side
also its arena address, rkey and size), bring every QP to RTS, post receives, bind the twins into
one link, then a one-byte barrier on every control channel so no rank writes before its peer is
ready. Teardown runs in the reverse order: link, QPs, CQ, channel, MR, arena, PD, device.
"""

from __future__ import annotations

import ctypes
import mmap
import secrets
from dataclasses import dataclass, field

from transport import verbs
from transport._native import LANES_ARGTYPES
from transport.errors import RendezvousError, TransportError
from transport.liveness import Liveness, PollingKeeper
from transport.rendezvous import Edge, EndpointRecord
from transport.topology import Port, RingSpec


@dataclass
class VerbsTwin:
    """One RDMA function of a neighbour's cable, and everything that must be torn down with it."""

    twin: int
    dev: verbs.Device
    arena: mmap.mmap
    mr: ctypes._Pointer
    channel: int
    cq: int
    tx_qp: int
    rx_qp: int
    tx_qpn: int
    rx_qpn: int
    sgid_index: int
    gid: bytes
    psn: dict[str, int] = field(default_factory=dict)
    handle: ctypes.c_void_p | None = None  # its sr_vpeer until the link owns it


@dataclass
class VerbsLink:
    """A ring neighbour over RDMA: its cable's twins, striped by the engine (one sr_vlink)."""

    peer_rank: int
    address: str
    cage: int
    twins: list[VerbsTwin]
    handle: ctypes.c_void_p | None = None


class VerbsFabric:
    """RDMA WRITE WITH IMMEDIATE into the peer's arenas; the engine runs the protocol."""

    name = "verbs"
    adds_in_place = False  # sr_verbs.c may add a frame into bytes it has not copied out yet
    connection_per_twin = False  # the twins' records share one control connection

    def __init__(self, spec: RingSpec, slot_bytes: int, window: int) -> None:
        self.slot_bytes, self.window, self.rank = slot_bytes, window, spec.rank
        self.max_send = 2 * window + 4
        self.ib, self.lib = verbs.libs()
        self.transfer_lanes = self.lib.sr_vtransfer_lanes
        self.lib.sr_vtransfer_lanes.argtypes = LANES_ARGTYPES
        self.lib.sr_vtransfer_lanes.restype = ctypes.c_int
        verbs.list_devices()  # NoRdmaError up front on a node without RDMA
        self.pending: dict[int, VerbsLink] = {}
        try:
            for port in spec.ports:
                if not port.twins:
                    raise TransportError(
                        f"cage {port.cage}: no RDMA device given for {port.address} "
                        "(the ring spec's twins[].rdma_device; cluster.yml ring_ports[].twins[].rdma)"
                    )
                link = VerbsLink(port.peer_rank, port.peer_address, port.cage, [])
                self.pending[port.cage] = link
                for t in range(len(port.twins)):
                    link.twins.append(self._prepare(port, t))
        except BaseException:
            for link in self.pending.values():
                self.close(link)
            raise

    def _prepare(self, port: Port, t: int) -> VerbsTwin:
        twin = port.twins[t]
        dev = verbs.Device.open(twin.rdma_device, twin.rdma_port)
        try:
            if t == 0:  # the twin that carries the port address
                sgid_index, gid = dev.resolve_gid_index(twin.gid_index, port.address)
            else:
                sgid_index, gid = dev.resolve_link_local_gid_index(twin.gid_index)
            size = 2 * self.window * (32 + self.slot_bytes)
            arena = mmap.mmap(-1, size)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(arena))
            access = verbs.ACCESS_LOCAL_WRITE | verbs.ACCESS_REMOTE_WRITE
            mr = self.ib.ibv_reg_mr(dev.pd, addr, size, access)
            if not mr:
                raise TransportError(
                    f"ibv_reg_mr of {size} bytes on {dev.name} failed (memlock limit? `ulimit -l`)"
                )
            channel = self.ib.ibv_create_comp_channel(dev.context)
            if not channel:
                raise TransportError(f"ibv_create_comp_channel on {dev.name} failed")
            cq = self.ib.ibv_create_cq(dev.context, 4 * self.max_send, None, channel, 0)
            if not cq:
                raise TransportError(f"ibv_create_cq on {dev.name} failed")
            tx_qp, tx_qpn = verbs.create_rc_qp(dev, cq, self.max_send, self.window + 4)
            rx_qp, rx_qpn = verbs.create_rc_qp(dev, cq, self.max_send, self.window + 4)
        except BaseException:
            dev.close()
            raise
        psn = {"tx": secrets.randbits(24), "rx": secrets.randbits(24)}
        return VerbsTwin(t, dev, arena, mr, channel, cq, tx_qp, rx_qp, tx_qpn, rx_qpn, sgid_index, gid, psn)

    def record(self, spec: RingSpec, port: Port, direction: str) -> list[EndpointRecord]:
        """This rank's record of each twin of one directed edge."""
        link = self.pending[port.cage]
        records = []
        for twin in link.twins:
            base = dict(
                fabric="verbs",
                src_rank=spec.rank,
                dst_rank=port.peer_rank,
                world=spec.world,
                cage=port.cage,
                slot_bytes=self.slot_bytes,
                window=self.window,
                psn=twin.psn[direction],
                gid=twin.gid,
                twin=twin.twin,
                twins=len(link.twins),
            )
            if direction == "tx":
                records.append(EndpointRecord(qpn=twin.tx_qpn, **base))
            else:
                rx_size = self.window * (32 + self.slot_bytes)
                records.append(
                    EndpointRecord(
                        qpn=twin.rx_qpn,
                        rkey=twin.mr.contents.rkey,
                        addr=twin.mr.contents.addr,
                        size=rx_size,
                        **base,
                    )
                )
        return records

    def open(self, spec: RingSpec, edges: list[Edge]) -> dict[int, VerbsLink]:
        links = {}
        for port in spec.ports:
            link = self.pending[port.cage]
            tx = next(e for e in edges if e.port == port and e.direction == "tx")
            rx = next(e for e in edges if e.port == port and e.direction == "rx")
            for twin in link.twins:
                self._connect(spec, port, twin, tx.peer_records[twin.twin], rx.peer_records[twin.twin])
            vpeers = (ctypes.c_void_p * len(link.twins))(*(twin.handle.value for twin in link.twins))
            handle = self.lib.sr_vlink_new(vpeers, len(link.twins))
            if not handle:
                raise TransportError(
                    f"rank {port.peer_rank} at {port.peer_address}: binding its twins failed"
                )
            link.handle = ctypes.c_void_p(handle)
            for twin in link.twins:
                twin.handle = None  # the link owns the twins' engines now
            links[port.peer_rank] = link
        for edge in edges:  # barrier: both ends are in RTS with receives posted
            edge.sock.sendall(b"R")
        for edge in edges:
            if edge.sock.recv(1) != b"R":
                raise RendezvousError(
                    f"rank {edge.port.peer_rank} at {edge.port.peer_address}: left before RTS"
                )
            edge.sock.close()
        self.pending = {}
        return links

    def _connect(
        self, spec: RingSpec, port: Port, twin: VerbsTwin, tx_peer: EndpointRecord, rx_peer: EndpointRecord
    ) -> None:
        """One twin's QPs to the peer's same twin, then its engine (an sr_vpeer)."""
        peer = f"rank {port.peer_rank} at {port.peer_address} (twin {twin.twin})"
        want_size = self.window * (32 + self.slot_bytes)
        if tx_peer.size != want_size or not tx_peer.rkey or not tx_peer.qpn:
            raise RendezvousError(
                f"{peer}: rx arena record size={tx_peer.size} rkey={tx_peer.rkey}, "
                f"expected size {want_size} and a registered region",
                port.peer_rank,
            )
        # Our tx QP talks to the peer's rx QP and the other way round; PSNs cross.
        verbs.connect_rc_qp(
            twin.dev, twin.tx_qp, twin.sgid_index, tx_peer.gid, tx_peer.qpn, tx_peer.psn, twin.psn["tx"]
        )
        verbs.connect_rc_qp(
            twin.dev, twin.rx_qp, twin.sgid_index, rx_peer.gid, rx_peer.qpn, rx_peer.psn, twin.psn["rx"]
        )
        handle = self.lib.sr_vpeer_new(
            spec.rank,
            port.peer_rank,
            twin.tx_qp,
            twin.rx_qp,
            twin.cq,
            twin.channel,
            twin.mr.contents.addr,
            twin.mr.contents.lkey,
            tx_peer.addr,
            tx_peer.rkey,
            self.slot_bytes,
            self.window,
            self.max_send,
        )
        if not handle:
            raise TransportError(f"{peer}: posting the initial receives failed")
        twin.handle = ctypes.c_void_p(handle)

    def watch(self, links: list[VerbsLink], liveness: Liveness) -> PollingKeeper:
        """Heartbeats and the dead-peer bound on every link (transport.liveness.PollingKeeper)."""
        return PollingKeeper(self.lib.sr_vlink_keepalive, self.rank, links, liveness)

    def stats(self, link: VerbsLink) -> dict[str, int]:
        """Frame and byte counters of the link, every twin summed."""
        out = (ctypes.c_uint64 * 6)()
        self.lib.sr_vlink_stats(link.handle, ctypes.byref(out))
        keys = ("frames_tx", "frames_rx", "bytes_tx", "bytes_rx", "acks_tx", "acks_rx")
        return dict(zip(keys, out, strict=True))

    def close(self, link: VerbsLink, linger_s: float = 0.0) -> None:
        """Tear down once the peer acknowledged our frames (at most ``linger_s``)."""
        if link.handle:
            self.lib.sr_vlink_free(link.handle, int(linger_s * 1000))
            link.handle = None
        for twin in link.twins:
            if twin.handle:
                self.lib.sr_vpeer_free(twin.handle, 0)
                twin.handle = None
            self.ib.ibv_destroy_qp(twin.tx_qp)
            self.ib.ibv_destroy_qp(twin.rx_qp)
            self.ib.ibv_destroy_cq(twin.cq)
            self.ib.ibv_destroy_comp_channel(twin.channel)
            self.ib.ibv_dereg_mr(twin.mr)
            twin.dev.close()
            twin.arena.close()
        link.twins = []
