"""The documentation of the transfer options both fan-out modules take.

sparkring_image_fanout (one image archive) and sparkring_model (every file of a checkpoint) run the
same relay (module_utils/sparkring_fanout.py); its TRANSFER_OPTIONS is the argument spec these
describe, and tests/unit/modules keeps this text equal to it through ansible-doc. Each module
documents its own C(port) and C(reserve_bytes).
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  rank:
    description: This host's rank (hostvar C(sparkring_rank)).
    type: int
  world_size:
    description: Number of ranks (hostvar C(sparkring_world_size)).
    type: int
  ports:
    description: This rank's ring ports (hostvar C(sparkring_ports)); C(peer_rank), C(address), C(peer_address) are used.
    type: list
    elements: dict
  transfer:
    description:
      - Run the transfer agent. Every rank must run it when any rank lacks something, because relays
        forward for their neighbours; the role sets it from the check-mode plans of all ranks.
    type: bool
    default: true
  connect_timeout:
    description: Seconds to wait for a neighbour to connect or to accept a connection.
    type: int
    default: 120
  io_timeout:
    description: Seconds without progress on a link before the transfer fails, naming the edge.
    type: int
    default: 60
  max_resends:
    description: How often a chunk that fails verification is asked for again.
    type: int
    default: 3
  max_rate_mbit:
    description: Pace each link this rank sends on to at most this many Mbit/s (0 = as fast as the link goes).
    type: int
    default: 0
  fault_corrupt_chunks:
    description: Fault injection for tests only. Chunk indices this rank corrupts once when it sends them.
    type: list
    elements: int
    default: []
"""
