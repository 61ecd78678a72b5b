"""The documentation of a ring port, the one argument both node-side ring modules take.

sparkring_preflight takes a rank's ports (PORTS: O(ports)) and sparkring_cable one of them and
the others (CABLE_END: O(port), O(announce)); module_utils/sparkring_ring_checks.py
RING_PORT_OPTIONS is the argument spec they enforce, and tests/unit/modules keeps this text equal
to it through ansible-doc.
"""

from __future__ import annotations

# The suboptions of one port (an element of the inventory's sparkring_ports), indented for both uses.
_PORT_SUBOPTIONS = r"""
    suboptions:
      cage: {type: int, required: true, description: Cage index of the port (0 or 1).}
      interface: {type: str, required: true, description: The interface that carries the port address (its first twin).}
      edge: {type: str, required: true, description: Edge (cable) id.}
      address: {type: str, required: true, description: IPv4 address of the port.}
      prefix: {type: int, required: true, description: Prefix length of the cable subnet.}
      cidr: {type: str, description: Address/prefix (informational).}
      subnet: {type: str, description: The edge's subnet (informational).}
      twins:
        description:
          - The cage's functions (a Spark cage is two x4 netdev/RDMA twins), in inventory order.
          - The first carries the port address and its IPv4-mapped RoCE v2 GID; another twin carries
            no IPv4 address and moves RDMA over its link-local RoCE v2 GID.
        type: list
        elements: dict
        required: true
        suboptions:
          interface: {type: str, required: true, description: The twin's network interface.}
          address: {type: str, description: The address it carries (the first twin) or null.}
          rdma_device: {type: str, description: Its RDMA device (verbs fabric).}
          rdma_port: {type: int, description: Its RDMA device port (verbs fabric).}
          gid_index: {type: raw, description: 'Its RoCE v2 GID index, or C(auto) to find it.'}
      peer_rank: {type: int, required: true, description: Rank at the other end of the cable.}
      peer_host: {type: str, required: true, description: Inventory host of the peer (the beacon must name it).}
      peer_address: {type: str, required: true, description: Peer port address.}
      peer_interface: {type: str, description: Peer interface (informational).}
      peer_cage: {type: int, required: true, description: Cage of the peer port.}
"""


class ModuleDocFragment:
    PORTS = (
        r"""
options:
  ports:
    description: This rank's ring ports (the inventory's C(sparkring_ports)).
    type: list
    elements: dict
    required: true"""
        + _PORT_SUBOPTIONS
    )

    CABLE_END = (
        r"""
options:
  port:
    description: The ring port at this end of the cable (one element of the inventory's C(sparkring_ports)).
    type: dict
    required: true"""
        + _PORT_SUBOPTIONS
        + r"""
  announce:
    description:
      - This node's other ring ports. Beacons go out on their twins too (nothing is listened to),
        so a cable plugged into the wrong cage still reaches a port that hears who it is.
    type: list
    elements: dict
    default: []"""
        + _PORT_SUBOPTIONS
    )
