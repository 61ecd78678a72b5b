"""The verbs fabric: per neighbour one registered arena and two RC queue pairs (tx, rx).

Setup order: open the port's device and check it (active, the port address's RoCE v2
GID), allocate and register the arena, create the completion channel, the CQ and both QPs
in INIT, exchange
endpoint records over the rendezvous channel (QPN, PSN, GID; the rx side also its arena
address, rkey and size), bring both QPs to RTS, post receives, then a one-byte barrier on
every control channel so no rank writes before its peer is ready. Teardown runs in the
reverse order: QPs, CQ, channel, MR, arena, PD, device.
"""

from __future__ import annotations

import ctypes
import mmap
import secrets
from dataclasses import dataclass, field

from transport import verbs
from transport._native import LANES_ARGTYPES
from transport.errors import RendezvousError, TransportError
from transport.rendezvous import Edge, EndpointRecord
from transport.topology import Port, RingSpec


@dataclass
class VerbsLink:
    """A ring neighbour over RDMA, and everything that must be torn down with it."""

    peer_rank: int
    address: str
    cage: int
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
    handle: ctypes.c_void_p | None = None


class VerbsFabric:
    """RDMA WRITE WITH IMMEDIATE into the peer's arena; the engine runs the protocol."""

    name = "verbs"
    adds_in_place = False  # sr_verbs.c may add a frame into bytes it has not copied out yet

    def __init__(self, spec: RingSpec, slot_bytes: int, window: int) -> None:
        self.slot_bytes, self.window = slot_bytes, window
        self.max_send = 2 * window + 4
        self.ib, self.lib = verbs.libs()
        self.transfer_lanes = self.lib.sr_vtransfer_lanes
        self.lib.sr_vtransfer_lanes.argtypes = LANES_ARGTYPES
        self.lib.sr_vtransfer_lanes.restype = ctypes.c_int
        verbs.list_devices()  # NoRdmaError up front on a node without RDMA
        self.pending: dict[int, VerbsLink] = {}
        try:
            for port in spec.ports:
                self.pending[port.cage] = self._prepare(port)
        except BaseException:
            for link in self.pending.values():
                self.close(link)
            raise

    def _prepare(self, port: Port) -> VerbsLink:
        if not port.rdma_device:
            raise TransportError(
                f"cage {port.cage}: no RDMA device given for {port.address} (--device / rdma.device)"
            )
        dev = verbs.Device.open(port.rdma_device, port.rdma_port)
        try:
            sgid_index, gid = dev.resolve_gid_index(port.gid_index, port.address)
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
        return VerbsLink(port.peer_rank, port.peer_address, port.cage, dev, arena, mr, channel, cq, tx_qp, rx_qp, tx_qpn,
                         rx_qpn, sgid_index, gid, psn)  # fmt: skip

    def record(self, spec: RingSpec, port: Port, direction: str) -> EndpointRecord:
        link = self.pending[port.cage]
        base = dict(fabric="verbs", src_rank=spec.rank, dst_rank=port.peer_rank, world=spec.world, cage=port.cage,
                    slot_bytes=self.slot_bytes, window=self.window, psn=link.psn[direction], gid=link.gid)  # fmt: skip
        if direction == "tx":
            return EndpointRecord(qpn=link.tx_qpn, **base)
        rx_size = self.window * (32 + self.slot_bytes)
        return EndpointRecord(qpn=link.rx_qpn, rkey=link.mr.contents.rkey, addr=link.mr.contents.addr, size=rx_size,
                              **base)  # fmt: skip

    def open(self, spec: RingSpec, edges: list[Edge]) -> dict[int, VerbsLink]:
        links = {}
        for port in spec.ports:
            link = self.pending[port.cage]
            tx = next(e for e in edges if e.port == port and e.direction == "tx")
            rx = next(e for e in edges if e.port == port and e.direction == "rx")
            peer = f"rank {port.peer_rank} at {port.peer_address}"
            want_size = self.window * (32 + self.slot_bytes)
            if tx.peer_record.size != want_size or not tx.peer_record.rkey or not tx.peer_record.qpn:
                raise RendezvousError(f"{peer}: rx arena record size={tx.peer_record.size} rkey={tx.peer_record.rkey}, "
                                      f"expected size {want_size} and a registered region", port.peer_rank)  # fmt: skip
            # Our tx QP talks to the peer's rx QP and the other way round; PSNs cross.
            verbs.connect_rc_qp(link.dev, link.tx_qp, link.sgid_index, tx.peer_record.gid, tx.peer_record.qpn,
                                tx.peer_record.psn, link.psn["tx"])  # fmt: skip
            verbs.connect_rc_qp(link.dev, link.rx_qp, link.sgid_index, rx.peer_record.gid, rx.peer_record.qpn,
                                rx.peer_record.psn, link.psn["rx"])  # fmt: skip
            handle = self.lib.sr_vpeer_new(spec.rank, port.peer_rank, link.tx_qp, link.rx_qp, link.cq, link.channel,
                                           link.mr.contents.addr, link.mr.contents.lkey, tx.peer_record.addr,
                                           tx.peer_record.rkey, self.slot_bytes, self.window, self.max_send)  # fmt: skip
            if not handle:
                raise TransportError(f"{peer}: posting the initial receives failed")
            link.handle = ctypes.c_void_p(handle)
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

    def stats(self, link: VerbsLink) -> dict[str, int]:
        out = (ctypes.c_uint64 * 6)()
        self.lib.sr_vpeer_stats(link.handle, ctypes.byref(out))
        keys = ("frames_tx", "frames_rx", "bytes_tx", "bytes_rx", "acks_tx", "acks_rx")
        return dict(zip(keys, out, strict=True))

    def close(self, link: VerbsLink, linger_s: float = 0.0) -> None:
        """Tear down once the peer acknowledged our frames (at most ``linger_s``)."""
        if link.handle:
            self.lib.sr_vpeer_free(link.handle, int(linger_s * 1000))
            link.handle = None
        self.ib.ibv_destroy_qp(link.tx_qp)
        self.ib.ibv_destroy_qp(link.rx_qp)
        self.ib.ibv_destroy_cq(link.cq)
        self.ib.ibv_destroy_comp_channel(link.channel)
        self.ib.ibv_dereg_mr(link.mr)
        link.dev.close()
        link.arena.close()
