"""The hostvars and groups a validated cluster publishes (the contract later stages read).

Everything ring-shaped (neighbours, peers, rounds) comes from `transport.geometry`, so the
inventory, the checks and the collectives agree on one ring.
"""

from __future__ import annotations

from typing import Any

from sparkring.cluster import Cluster, Rank, RingPort, Twin
from transport.geometry import matching_rounds, neighbours

HEAD_GROUP = "sparkring_head"
WORKERS_GROUP = "sparkring_workers"
ALL_GROUP = "sparkring"


def cluster_groups(cluster: Cluster) -> dict[str, list[str]]:
    """`sparkring` (every rank), `sparkring_head` (rank 0), `sparkring_workers` (the others)."""
    hosts = [r.host for r in cluster.ranks]
    return {ALL_GROUP: hosts, HEAD_GROUP: hosts[:1], WORKERS_GROUP: hosts[1:]}


def cluster_hostvars(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every rank's hostvars, keyed by inventory host (plain JSON types only)."""
    ends: dict[str, list[tuple[Rank, RingPort]]] = {}
    for rank in cluster.ranks:
        for port in rank.ring_ports:
            ends.setdefault(port.edge, []).append((rank, port))
    return {
        rank.host: {**_ssh_vars(cluster, rank), **_ring_vars(cluster, rank, ends)} for rank in cluster.ranks
    }


def _ssh_vars(cluster: Cluster, rank: Rank) -> dict[str, Any]:
    ssh, override = cluster.ssh, rank.ssh
    hostvars: dict[str, Any] = {
        "ansible_host": (override and override.host) or str(rank.management.address.ip),
        "ansible_user": ssh.user,
        "ansible_port": (override and override.port) or ssh.port,
        "ansible_python_interpreter": ssh.python_interpreter,
    }
    if ssh.private_key_file:
        hostvars["ansible_ssh_private_key_file"] = ssh.private_key_file
    args = []
    if ssh.proxy_command:
        args.append(f'-o ProxyCommand="{ssh.proxy_command}"')
    if ssh.known_hosts_file:
        args.append(f"-o UserKnownHostsFile={ssh.known_hosts_file}")
    if args:
        hostvars["ansible_ssh_common_args"] = " ".join(args)
    return hostvars


def _ring_vars(cluster: Cluster, rank: Rank, ends: dict[str, list[tuple[Rank, RingPort]]]) -> dict[str, Any]:
    n = len(cluster.ranks)
    verbs = cluster.cluster.fabric == "verbs"
    by_rank = {r.rank: r for r in cluster.ranks}
    links = [(port, *_peer(rank, port, ends)) for port in sorted(rank.ring_ports, key=lambda port: port.cage)]
    # The port towards each neighbour; on a pair the one port serves the one round.
    towards = {peer.rank: (port, peer_port) for port, peer, peer_port in links}
    left, right = neighbours(rank.rank, n)
    management = rank.management.address
    return {
        "sparkring_cluster_name": cluster.cluster.name,
        "sparkring_fabric": cluster.cluster.fabric,
        "sparkring_mtu": cluster.cluster.mtu,
        "sparkring_link_speed_mbps": cluster.cluster.link_speed_mbps,
        "sparkring_rank": rank.rank,
        "sparkring_world_size": n,
        "sparkring_hostname": rank.hostname,
        "sparkring_management": {
            "interface": rank.management.interface,
            "address": str(management.ip),
            "prefix": management.network.prefixlen,
            "cidr": str(management),
        },
        "sparkring_left": {"rank": left, "host": by_rank[left].host},
        "sparkring_right": {"rank": right, "host": by_rank[right].host},
        "sparkring_ports": [_port_vars(cluster, *link, verbs) for link in links],
        "sparkring_rounds": [
            {
                "round": r.round,
                "peer_rank": r.peer,
                "peer_host": by_rank[r.peer].host,
                "peer_address": str(towards[r.peer][1].address),
                "cage": towards[r.peer][0].cage,
                "interface": towards[r.peer][0].interface,
            }
            for r in matching_rounds(rank.rank, n)
        ],
    }


def _peer(rank: Rank, port: RingPort, ends: dict[str, list[tuple[Rank, RingPort]]]) -> tuple[Rank, RingPort]:
    """The rank and port at the other end of `port`'s cable (validation guarantees exactly one)."""
    (peer,) = [(r, p) for r, p in ends[port.edge] if r.rank != rank.rank]
    return peer


def _port_vars(
    cluster: Cluster, port: RingPort, peer: Rank, peer_port: RingPort, verbs: bool
) -> dict[str, Any]:
    subnet = next(e.subnet for e in cluster.edges if e.id == port.edge)
    return {
        "cage": port.cage,
        "interface": port.interface,
        "edge": port.edge,
        "address": str(port.address),
        "prefix": subnet.prefixlen,
        "cidr": f"{port.address}/{subnet.prefixlen}",
        "subnet": str(subnet),
        "twins": [
            _twin_vars(twin, str(port.address) if t == 0 else None, verbs)
            for t, twin in enumerate(port.twins)
        ],
        "peer_rank": peer.rank,
        "peer_host": peer.host,
        "peer_address": str(peer_port.address),
        "peer_interface": peer_port.interface,
        "peer_cage": peer_port.cage,
    }


def _twin_vars(twin: Twin, address: str | None, verbs: bool) -> dict[str, Any]:
    """One twin: its interface, the address it carries (the first twin only) and, on verbs, its RDMA."""
    rdma = twin.rdma if verbs else None
    return {
        "interface": twin.interface,
        "address": address,
        "rdma_device": rdma.device if rdma else None,
        "rdma_port": rdma.port if rdma else None,
        "gid_index": rdma.gid_index if rdma else None,
    }
