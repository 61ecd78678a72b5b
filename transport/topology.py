"""Who a rank talks to: its ring ports and the cable geometry of the inventory contract.

A rank has one port per ring cable (two on a ring of four or more, one on a pair). The ring's
shape is `transport.geometry`'s; `cable_geometry` adds the addressing of the sim and loopback
rings: cable i in its own /24, rank i on .1 and rank (i + 1) % N on .2.

A port is one cage. On the verbs fabric it has one RDMA device per twin (a Spark cage is two
x4 functions of ~100 Gb/s each, and only both together carry the cable's rate): the first twin
carries the port address and its IPv4-mapped RoCE v2 GID, the second RDMA over its link-local
RoCE v2 GID. Twin t talks to twin t of the peer's port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from transport.geometry import cable_cage, neighbours, ring_cables, world_size_problem


@dataclass(frozen=True)
class Twin:
    """One RDMA function of a cage: device, device port and the GID index to use ("auto" finds it)."""

    rdma_device: str
    rdma_port: int = 1
    gid_index: int | str = "auto"


@dataclass(frozen=True)
class Port:
    """One end of a ring cable; ``twins`` are its RDMA functions (verbs), the first carries ``address``."""

    cage: int
    address: str
    peer_rank: int
    peer_address: str
    twins: tuple[Twin, ...] = ()


@dataclass(frozen=True)
class RingSpec:
    """A rank's view of the ring: its id, the world size and its ports."""

    rank: int
    world: int
    ports: tuple[Port, ...]

    def __post_init__(self) -> None:
        problem = world_size_problem(self.world)
        if problem:
            raise ValueError(f"world size {self.world}: {problem}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside 0..{self.world - 1}")
        want = set(neighbours(self.rank, self.world))
        have = {p.peer_rank for p in self.ports}
        if have != want or len(self.ports) != len(want):
            raise ValueError(
                f"rank {self.rank}: ports reach ranks {sorted(have)}, a ring neighbour set is {sorted(want)}"
            )

    def port_to(self, peer_rank: int) -> Port:
        """The port whose cable ends at ``peer_rank``."""
        for port in self.ports:
            if port.peer_rank == peer_rank:
                return port
        raise ValueError(
            f"rank {self.rank} has no cable to rank {peer_rank}: only ring neighbours are reachable"
        )

    @property
    def right(self) -> int:
        return neighbours(self.rank, self.world)[1]

    @property
    def left(self) -> int:
        return neighbours(self.rank, self.world)[0]


def cable_geometry(rank: int, world: int, prefix: str) -> RingSpec:
    """The inventory contract's ring: cable i in ``<prefix>.i.0/24``, rank i on .1, rank i+1 on .2.

    ``prefix`` is the first two octets (``198.19`` in the sim, ``127.77`` on loopback).
    """
    ports = []
    for cable, (lo, hi) in enumerate(ring_cables(world)):
        if rank not in (lo, hi):
            continue
        mine, theirs = (1, 2) if rank == lo else (2, 1)
        net = ipaddress.ip_network(f"{prefix}.{cable}.0/24")
        ports.append(
            Port(
                cage=cable_cage(cable, world) or 0,
                address=str(net[mine]),
                peer_rank=hi if rank == lo else lo,
                peer_address=str(net[theirs]),
            )
        )
    return RingSpec(rank, world, tuple(sorted(ports, key=lambda p: p.cage)))


def from_hostvars(hostvars: dict) -> RingSpec:
    """A RingSpec from the inventory plugin's hostvars (sparkring_rank, _world_size, _ports).

    The overlay role's ring.json holds the same port records, so the overlay reads it here too.
    """
    ports = tuple(
        Port(
            cage=int(p["cage"]),
            address=str(p["address"]),
            peer_rank=int(p["peer_rank"]),
            peer_address=str(p["peer_address"]),
            twins=tuple(
                Twin(
                    str(t["rdma_device"]),
                    int(t.get("rdma_port") or 1),
                    t["gid_index"] if t.get("gid_index") is not None else "auto",
                )
                for t in p.get("twins") or ()
                if t.get("rdma_device")
            ),
        )
        for p in hostvars["sparkring_ports"]
    )
    return RingSpec(int(hostvars["sparkring_rank"]), int(hostvars["sparkring_world_size"]), ports)
