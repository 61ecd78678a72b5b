"""Transport errors: every one names the peer (rank and address) and the collective."""

from __future__ import annotations


class TransportError(RuntimeError):
    """A collective or link failed; the communicator is unusable afterwards."""

    def __init__(self, message: str, peer_rank: int | None = None, collective: str | None = None) -> None:
        super().__init__(message)
        self.peer_rank = peer_rank
        self.collective = collective


class PeerTimeoutError(TransportError):
    """A peer sent nothing (or acknowledged nothing) within the bound."""


class PeerClosedError(TransportError):
    """A peer closed or reset its connection: it died or gave up."""


class ProtocolError(TransportError):
    """A frame was corrupted, out of sequence or malformed."""


class RendezvousError(TransportError):
    """Endpoint records disagreed, or a neighbour could not be reached during setup."""


class NoRdmaError(TransportError):
    """This node has no usable RDMA device (the verbs fabric cannot run here)."""


class VerbsLayoutError(TransportError):
    """The ctypes verbs structs do not match the installed infiniband/verbs.h."""


# Native status codes (enum sr_status in csrc/sr_wire.h) -> exception class.
NATIVE_ERRORS: dict[int, type[TransportError]] = {
    1: PeerTimeoutError,
    2: PeerClosedError,
    3: ProtocolError,
    4: ProtocolError,
    5: ProtocolError,
    6: TransportError,
    7: TransportError,
}
