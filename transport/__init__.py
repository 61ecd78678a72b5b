"""SparkRing ring transport: ring collectives over a native progress engine.

Fabrics: ``tcp`` (the same sequence/ack protocol over sockets; the simulated ring and a
fallback) and ``verbs`` (RDMA WRITE with immediate over RoCE RC queue pairs). See
docs/design.md §3.6 and ``python -m transport probe --help``.
"""

from transport.comm import Communicator
from transport.errors import (
    NoRdmaError,
    PeerClosedError,
    PeerTimeoutError,
    ProtocolError,
    RendezvousError,
    TransportError,
)
from transport.topology import Port, RingSpec, Twin

__all__ = [
    "Communicator",
    "NoRdmaError",
    "PeerClosedError",
    "PeerTimeoutError",
    "Port",
    "ProtocolError",
    "RendezvousError",
    "RingSpec",
    "TransportError",
    "Twin",
]
