"""The cluster inventory schema (docs/design.md §3.1) and the ring geometry every stage derives from.

`cluster.yml` is the only gate between a typo and a four-node outage, so the schema is strict:
unknown keys are errors, values are never coerced, everything that reaches a shell is checked
against a conservative character set, and every problem is reported at once as
`<field path>: <what is wrong and what is expected>`. The ring's shape (cables, neighbours,
cages, matching rounds, the world-size rule) comes from `transport.geometry`, as it does for
the hostvars in `sparkring.hostvars` and for every stage after them.
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from transport.geometry import cable_between, cable_cage, ring_cables, world_size_problem
from transport.integrity import is_secret_name

PLUGIN_NAME = "sparkring_cluster"
SCHEMA_VERSION = 2
# What changed at each version, for the error a file of an older version gets.
_VERSION_NOTES = {
    1: "version 2 describes each ring port's twins (a Spark cage is two netdev/RDMA functions): "
    "move the port's interface and rdma into twins: [{interface, rdma}, {interface, rdma}] and set version: 2",
}
RING_MTU = 9000
RING_PREFIX = 24
# A RoCE port's GID table has at most 256 entries (the node reports its own gid_tbl_len).
MAX_GID_INDEX = 255

# ---------------------------------------------------------------------------------------------
# Problems: every rejection is a list of (field path, message) pairs.


class Problem(NamedTuple):
    """One thing wrong with an inventory, at a field path in the user's terms."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ClusterValidationError(ValueError):
    """An inventory was rejected; `problems` holds every reason, one per field."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(map(str, self.problems)))


def _invalid(message: str) -> PydanticCustomError:
    # The message travels in ctx so that braces in user values are never read as a template.
    return PydanticCustomError("sparkring", "{message}", {"message": message})


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------
# Field types: names and paths that end up in shell commands, addresses, subnets.

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
_SECRET_MESSAGE = "looks like a secret: secrets never live in cluster.yml; supply them from Ansible Vault or the environment"


def _text(kind: str, pattern: str, expected: str) -> BeforeValidator:
    """A string field matching `pattern` in full; the error says what `kind` expects."""
    regex = re.compile(pattern)

    def check(value: object) -> str:
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise _invalid(f"{_show(value)} is not a valid {kind}: expected {expected}")
        return value

    return BeforeValidator(check)


def _hostname(value: object) -> str:
    if isinstance(value, str) and _HOSTNAME.fullmatch(value) and not _DOTTED_NUMBERS.fullmatch(value):
        return value
    raise _invalid(
        f"{_show(value)} is not a valid hostname: expected RFC 1123 labels (letters, digits, '-', "
        "1-63 characters each, not starting or ending with '-') joined by '.'"
    )


def _ssh_host(value: object) -> str:
    if isinstance(value, str) and _DOTTED_NUMBERS.fullmatch(value):
        return str(_ipv4(value))
    return _hostname(value)


def _ipv4(value: object) -> ipaddress.IPv4Address:
    if isinstance(value, str) and "/" in value:
        raise _invalid(
            f"{_show(value)}: expected a bare IPv4 address; the /{RING_PREFIX} comes from the edge"
        )
    try:
        return ipaddress.IPv4Address(value if isinstance(value, str) else "")
    except ValueError:
        raise _invalid(
            f"{_show(value)} is not an IPv4 address: expected a dotted quad such as 198.51.100.1"
        ) from None


def _ipv4_interface(value: object) -> ipaddress.IPv4Interface:
    text = value if isinstance(value, str) else ""
    try:
        if "/" not in text:
            raise ValueError
        return ipaddress.IPv4Interface(text)
    except ValueError:
        raise _invalid(
            f"{_show(value)}: expected an IPv4 address with its prefix, such as 192.0.2.10/24"
        ) from None


def _ipv4_network(value: object) -> ipaddress.IPv4Network:
    try:
        network = ipaddress.IPv4Network(value if isinstance(value, str) and "/" in value else "")
    except ValueError:
        raise _invalid(
            f"{_show(value)}: expected an IPv4 network with no host bits set, such as 198.51.100.0/24"
        ) from None
    if network.is_loopback or network.is_multicast or network.is_reserved or network.is_link_local:
        raise _invalid(
            f"{network} is a loopback, multicast, link-local or reserved range: expected a unicast subnet"
        )
    if network.network_address == ipaddress.IPv4Address(0):
        raise _invalid(f"{network} includes 0.0.0.0: expected a unicast subnet")
    return network


def _ring_subnet(value: object) -> ipaddress.IPv4Network:
    network = _ipv4_network(value)
    if network.prefixlen != RING_PREFIX:
        raise _invalid(f"{network} is a /{network.prefixlen}: expected a /{RING_PREFIX}, one per cable")
    return network


def _management_subnet(value: object) -> ipaddress.IPv4Network:
    network = _ipv4_network(value)
    if not 8 <= network.prefixlen <= 30:
        raise _invalid(f"{network} is a /{network.prefixlen}: expected a prefix between /8 and /30")
    return network


def _gid_index(value: object) -> int | str:
    if value == "auto" and isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_GID_INDEX:
        return value
    raise _invalid(
        f'{_show(value)}: expected "auto" or a RoCE v2 GID index 0-{MAX_GID_INDEX} '
        f"(a RoCE GID table has at most {MAX_GID_INDEX + 1} entries)"
    )


Name = Annotated[
    str, _text("name", r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", "1-63 of A-Z a-z 0-9 _ . -, starting alphanumeric")
]
Hostname = Annotated[str, BeforeValidator(_hostname)]
SshHost = Annotated[str, BeforeValidator(_ssh_host)]
Interface = Annotated[
    str,
    _text(
        "interface name",
        r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}",
        "1-15 of A-Z a-z 0-9 _ . : -, starting alphanumeric (Linux IFNAMSIZ)",
    ),
]
RdmaDevice = Annotated[
    str,
    _text(
        "RDMA device name",
        r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}",
        "1-64 of A-Z a-z 0-9 _ . -, such as rocep1s0f0",
    ),
]
SshUser = Annotated[
    str,
    _text(
        "ssh user", r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", "1-32 of A-Z a-z 0-9 _ . -, not starting with a digit"
    ),
]
FilePath = Annotated[
    str,
    _text(
        "file path", r"(?:/|~/)[A-Za-z0-9_.+/-]{1,1023}", "an absolute or ~/ path of A-Z a-z 0-9 _ . + / -"
    ),
]
Interpreter = Annotated[str, _text("interpreter path", r"/[A-Za-z0-9_.+/-]{1,1023}", "an absolute path")]
ProxyCommand = Annotated[
    str,
    _text(
        "ssh ProxyCommand",
        r"[A-Za-z0-9_./%@=+,:][A-Za-z0-9_./%@=+,: -]{0,255}",
        "up to 256 of A-Z a-z 0-9 space _ . / % @ = + , : - (no quotes or shell operators)",
    ),
]
Port = Annotated[int, Field(ge=1, le=65535)]
Ipv4 = Annotated[ipaddress.IPv4Address, BeforeValidator(_ipv4)]
RingSubnet = Annotated[ipaddress.IPv4Network, BeforeValidator(_ring_subnet)]
ManagementSubnet = Annotated[ipaddress.IPv4Network, BeforeValidator(_management_subnet)]
ManagementAddress = Annotated[ipaddress.IPv4Interface, BeforeValidator(_ipv4_interface)]
GidIndex = Annotated[int | Literal["auto"], BeforeValidator(_gid_index)]


# ---------------------------------------------------------------------------------------------
# The models, one per concept.


class _Strict(BaseModel):
    """No coercion and no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ClusterSettings(_Strict):
    name: Name = Field(description="the cluster's name")
    fabric: Literal["tcp", "verbs"] = Field(description='the ring transport fabric, "tcp" or "verbs"')
    mtu: int = Field(description=f"the MTU of every ring link ({RING_MTU})")
    link_speed_mbps: PositiveInt | None = Field(
        description="the expected link speed in Mb/s, or null to leave it unchecked"
    )
    management_subnet: ManagementSubnet = Field(description="the management network, such as 192.0.2.0/24")

    @field_validator("mtu")
    @classmethod
    def _jumbo(cls, mtu: int) -> int:
        if mtu != RING_MTU:
            raise _invalid(f"expected {RING_MTU} (jumbo frames on every ring link), got {mtu}")
        return mtu


class SshDefaults(_Strict):
    user: SshUser = Field(description="the ssh user Ansible logs in as")
    port: Port = Field(22, description="the ssh port (1-65535)")
    private_key_file: FilePath | None = Field(None, description="the ssh private key file")
    known_hosts_file: FilePath | None = Field(None, description="the ssh known_hosts file")
    proxy_command: ProxyCommand | None = Field(None, description="an ssh ProxyCommand (%h and %p allowed)")
    python_interpreter: Interpreter = Field("/usr/bin/python3", description="the nodes' Python")


class RankSsh(_Strict):
    host: SshHost | None = Field(
        None, description="the ssh host for this rank (default: its management address)"
    )
    port: Port | None = Field(None, description="the ssh port for this rank (default: ssh.port)")


class Edge(_Strict):
    id: Name = Field(description="the edge (cable) id that ring ports refer to, such as r0-r1")
    subnet: RingSubnet = Field(description=f"the cable's own /{RING_PREFIX}, such as 198.51.100.0/24")


class Rdma(_Strict):
    device: RdmaDevice = Field(description="the twin's RDMA device, such as rocep1s0f0")
    port: Annotated[int, Field(ge=1, le=255)] = Field(description="the RDMA device port (>= 1)")
    gid_index: GidIndex = Field(
        description='the index (0-255) of the twin\'s RoCE v2 GID, or "auto": on the first twin the '
        "IPv4-mapped GID of the port address, on the second its link-local GID"
    )


class Twin(_Strict):
    """One of a cage's functions: a netdev and its RDMA device (GB10 gives each x4 link one)."""

    interface: Interface = Field(description="the twin's network interface")
    rdma: Rdma | None = Field(None, description="the twin's RDMA device: {device, port, gid_index}")


class RingPort(_Strict):
    """One cage: the cable's end, its address, and the twins that share the cage's link."""

    cage: Annotated[int, Field(ge=0, le=1)] = Field(description="the QSFP cage of this port, 0 or 1")
    edge: Name = Field(description="the id of the edge (cable) this port is plugged into")
    address: Ipv4 = Field(
        description="the port's IPv4 address inside its edge's subnet, carried by its first twin"
    )
    twins: Annotated[list[Twin], Field(min_length=1, max_length=2)] = Field(
        description="the cage's functions, [{interface, rdma}, ...]: two on a Spark; the first carries "
        "the address and its RoCE v2 GID, the second moves RDMA traffic over its link-local GID"
    )

    @property
    def interface(self) -> str:
        """The interface that carries the port's address (its first twin)."""
        return self.twins[0].interface


class Management(_Strict):
    interface: Interface = Field(description="the management interface")
    address: ManagementAddress = Field(
        description="the management address with prefix, such as 192.0.2.10/24"
    )


class Rank(_Strict):
    rank: Annotated[int, Field(ge=0)] = Field(description="the rank id, 0..N-1 in list order")
    host: Hostname = Field(description="the Ansible inventory hostname")
    hostname: Hostname = Field(description="the node's own hostname")
    management: Management = Field(description="the management {interface, address}")
    ring_ports: Annotated[list[RingPort], Field(min_length=1, max_length=2)] = Field(
        description="the rank's ring ports: two on a ring, one on a pair"
    )
    ssh: RankSsh | None = Field(None, description="per-rank ssh {host, port} overrides")


class Cluster(_Strict):
    plugin: Literal["sparkring_cluster"] | None = Field(
        None, description=f'"{PLUGIN_NAME}" (keeps Ansible\'s plain YAML inventory plugin off this file)'
    )
    version: int = Field(description=f"the inventory format version ({SCHEMA_VERSION})")
    cluster: ClusterSettings = Field(description="the cluster settings {name, fabric, mtu, ...}")
    ssh: SshDefaults = Field(description="the ssh defaults {user, port, ...}")
    edges: Annotated[list[Edge], Field(min_length=1)] = Field(description="the cables, one {id, subnet} each")
    ranks: Annotated[list[Rank], Field(min_length=1)] = Field(description="the ranks, in order 0..N-1")

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != SCHEMA_VERSION:
            note = _VERSION_NOTES.get(version)
            raise _invalid(f"expected {SCHEMA_VERSION}, got {version}" + (f": {note}" if note else ""))
        return version

    @model_validator(mode="after")
    def _whole_ring(self) -> Cluster:
        problems = ring_problems(self)
        if problems:
            raise PydanticCustomError(
                "ring", "{message}", {"message": "\n".join(map(str, problems)), "problems": tuple(problems)}
            )
        return self


# ---------------------------------------------------------------------------------------------
# Cross-field checks: the ring as a whole.


def _port_path(rank_index: int, port_index: int, field: str) -> str:
    return f"ranks[{rank_index}].ring_ports[{port_index}].{field}"


def _twin_path(rank_index: int, port_index: int, twin_index: int, field: str) -> str:
    return _port_path(rank_index, port_index, f"twins[{twin_index}].{field}")


def ring_problems(c: Cluster) -> list[Problem]:
    """Every cross-field problem of a cluster whose fields are individually valid."""
    n = len(c.ranks)
    size = world_size_problem(n)
    problems = [Problem("ranks", size)] if size else []
    problems += _rank_problems(c) + _edge_problems(c) + _port_problems(c) + _address_problems(c)
    # Cables are named by rank: the cycle is only defined once the ranks are 0..N-1 in order.
    if not size and all(r.rank == i for i, r in enumerate(c.ranks)):
        problems += _cable_problems(c)
    return problems


def _duplicates(items: list[tuple[str, object]]) -> list[tuple[str, str]]:
    """(path, first path) for every item whose key an earlier item already has."""
    first: dict[object, str] = {}
    found = []
    for path, key in items:
        if key in first:
            found.append((path, first[key]))
        else:
            first[key] = path
    return found


def _rank_problems(c: Cluster) -> list[Problem]:
    n = len(c.ranks)
    problems = [
        Problem(f"ranks[{i}].rank", f"expected {i}: ranks are listed in order 0..{n - 1}, got {r.rank}")
        for i, r in enumerate(c.ranks)
        if r.rank != i
    ]
    for field in ("host", "hostname"):
        items = [(f"ranks[{i}].{field}", getattr(r, field).lower()) for i, r in enumerate(c.ranks)]
        problems += [
            Problem(path, f"also {first}: every rank is a different machine")
            for path, first in _duplicates(items)
        ]
    targets = [
        (f"ranks[{i}].ssh.host", (r.ssh.host.lower(), r.ssh.port or c.ssh.port))
        for i, r in enumerate(c.ranks)
        if r.ssh and r.ssh.host
    ]
    targets += [
        (
            f"ranks[{i}].management.address",
            (str(r.management.address.ip), (r.ssh and r.ssh.port) or c.ssh.port),
        )
        for i, r in enumerate(c.ranks)
        if not (r.ssh and r.ssh.host)
    ]
    problems += [
        Problem(path, f"the same ssh target as {first}: every rank is a different machine")
        for path, first in _duplicates(targets)
        if path.endswith("ssh.host") or first.endswith("ssh.host")
    ]
    return problems


def _edge_problems(c: Cluster) -> list[Problem]:
    problems = [
        Problem(path, f"also {first}: every edge needs its own id")
        for path, first in _duplicates([(f"edges[{k}].id", e.id) for k, e in enumerate(c.edges)])
    ]
    problems += [
        Problem(path, f"also {first}: every cable needs its own /{RING_PREFIX}")
        for path, first in _duplicates([(f"edges[{k}].subnet", e.subnet) for k, e in enumerate(c.edges)])
    ]
    management = c.cluster.management_subnet
    problems += [
        Problem(
            f"edges[{k}].subnet",
            f"{e.subnet} overlaps cluster.management_subnet {management}: expected ring subnets "
            "disjoint from the management network",
        )
        for k, e in enumerate(c.edges)
        if e.subnet.overlaps(management)
    ]
    return problems


def _port_problems(c: Cluster) -> list[Problem]:
    """Per rank: port count, edges that exist, distinct edges/cages/interfaces, RDMA blocks."""
    n = len(c.ranks)
    edges = {e.id: e for e in c.edges}
    wanted = 1 if n == 2 else 2
    problems = []
    for i, r in enumerate(c.ranks):
        ports = r.ring_ports
        if world_size_problem(n) is None and len(ports) != wanted:
            shape = (
                "a pair rank has one ring port (one cable)" if n == 2 else "a ring rank has two ring ports"
            )
            problems.append(Problem(f"ranks[{i}].ring_ports", f"{shape}, got {len(ports)}"))
        for p, port in enumerate(ports):
            edge = edges.get(port.edge)
            if edge is None:
                known = ", ".join(sorted(edges))
                problems.append(
                    Problem(_port_path(i, p, "edge"), f"unknown edge {port.edge!r}: expected one of {known}")
                )
            else:
                problems += _address_in_edge(_port_path(i, p, "address"), port.address, edge)
            problems += _gid_index_problems(i, p, port)
            if c.cluster.fabric == "verbs":
                problems += [
                    Problem(
                        _twin_path(i, p, t, "rdma"),
                        "required when cluster.fabric is verbs: {device, port, gid_index}",
                    )
                    for t, twin in enumerate(port.twins)
                    if twin.rdma is None
                ]
        for field, why in (("edge", "sit on different cables"), ("cage", "sit in different cages (0 and 1)")):
            items = [(_port_path(i, p, field), getattr(port, field)) for p, port in enumerate(ports)]
            problems += [
                Problem(path, f"same as {first}: a rank's two ports {why}")
                for path, first in _duplicates(items)
            ]
        twins = [(p, t, twin) for p, port in enumerate(ports) for t, twin in enumerate(port.twins)]
        interfaces = [(f"ranks[{i}].management.interface", r.management.interface)]
        interfaces += [(_twin_path(i, p, t, "interface"), twin.interface) for p, t, twin in twins]
        problems += [
            Problem(path, f"also {first}: every twin of every port of a rank has its own interface")
            for path, first in _duplicates(interfaces)
        ]
        devices = [
            (_twin_path(i, p, t, "rdma"), (twin.rdma.device, twin.rdma.port))
            for p, t, twin in twins
            if twin.rdma
        ]
        problems += [
            Problem(path, f"the same RDMA device and port as {first}: every twin has its own")
            for path, first in _duplicates(devices)
        ]
    return problems


def _gid_index_problems(i: int, p: int, port: RingPort) -> list[Problem]:
    """A fixed gid_index belongs to the twin that carries the address (its IPv4-mapped GID).

    Another twin has only link-local GIDs, which "auto" finds; a number there is, in the field,
    the first twin's index left on the wrong function after the twins were listed path B first.
    """
    return [
        Problem(
            _twin_path(i, p, t, "rdma.gid_index"),
            f"{twin.rdma.gid_index} on a twin that carries no address: only the first twin "
            f"({port.interface}) carries {port.address} and its IPv4-mapped GID; this twin's RDMA uses its "
            f"link-local RoCE v2 GID. Set gid_index: auto here, or, if {twin.interface} is the function that "
            "carries the address, list it first in twins",
        )
        for t, twin in enumerate(port.twins)
        if t > 0 and twin.rdma is not None and twin.rdma.gid_index != "auto"
    ]


def _address_in_edge(path: str, address: ipaddress.IPv4Address, edge: Edge) -> list[Problem]:
    subnet = edge.subnet
    if address not in subnet:
        return [Problem(path, f"{address} is outside edge {edge.id} subnet {subnet}")]
    if address in (subnet.network_address, subnet.broadcast_address):
        return [
            Problem(
                path, f"{address} is not a host address of edge {edge.id} subnet {subnet}: expected .1-.254"
            )
        ]
    return []


def _address_problems(c: Cluster) -> list[Problem]:
    """Management addresses inside their subnet and off the ring; every address unique."""
    management = c.cluster.management_subnet
    problems = []
    for i, r in enumerate(c.ranks):
        path, address = f"ranks[{i}].management.address", r.management.address
        if address.ip not in management:
            problems.append(Problem(path, f"{address.ip} is outside cluster.management_subnet {management}"))
        elif address.network.prefixlen != management.prefixlen:
            problems.append(
                Problem(
                    path,
                    f"prefix /{address.network.prefixlen} differs from cluster.management_subnet {management}",
                )
            )
        elif address.ip in (management.network_address, management.broadcast_address):
            problems.append(Problem(path, f"{address.ip} is not a host address of {management}"))
        problems += [
            Problem(
                path,
                f"{address.ip} is inside edge {e.id} subnet {e.subnet}: expected outside every ring subnet",
            )
            for e in c.edges
            if address.ip in e.subnet
        ]
    addresses = [(f"ranks[{i}].management.address", r.management.address.ip) for i, r in enumerate(c.ranks)]
    addresses += [
        (_port_path(i, p, "address"), port.address)
        for i, r in enumerate(c.ranks)
        for p, port in enumerate(r.ring_ports)
    ]
    problems += [
        Problem(path, f"also {first}: every address is unique") for path, first in _duplicates(addresses)
    ]
    return problems


def _cable_problems(c: Cluster) -> list[Problem]:
    """The edges form the one closed cycle, each claimed once by each end, cages matched."""
    n = len(c.ranks)
    claims: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, r in enumerate(c.ranks):
        for p, port in enumerate(r.ring_ports):
            claims[port.edge].append((i, p))
    problems = []
    cable_edges: dict[int, str] = {}
    for k, edge in enumerate(c.edges):
        ends = claims.get(edge.id, [])
        if len({i for i, _ in ends}) != 2 or len(ends) != 2:
            named = ", ".join(f"ranks[{i}].ring_ports[{p}]" for i, p in ends) or "no ring port"
            need = "expected exactly one port on each of two different ranks"
            problems.append(Problem(f"edges[{k}]", f"edge {edge.id} is claimed by {named}: {need}"))
            continue
        (a, pa), (b, pb) = ends
        cable = cable_between(a, b, n)
        if cable is None:
            problems.append(
                Problem(
                    f"edges[{k}]",
                    f"edge {edge.id} joins ranks {a} and {b}, which are not ring neighbours: "
                    f"expected the cycle {_cycle(n)}",
                )
            )
        elif cable in cable_edges:
            problems.append(
                Problem(
                    f"edges[{k}]",
                    f"ranks {a} and {b} are already joined by edge {cable_edges[cable]}: "
                    "expected one cable per neighbour pair",
                )
            )
        else:
            cable_edges[cable] = edge.id
            problems += _cage_problems(c, edge.id, cable, ((a, pa), (b, pb)))
            problems += _twin_count_problems(c, edge.id, ((a, pa), (b, pb)))
    problems += [
        Problem(
            "edges", f"no edge joins ranks {a} and {b}: expected one edge per cable of the cycle {_cycle(n)}"
        )
        for cable, (a, b) in enumerate(ring_cables(n))
        if cable not in cable_edges
    ]
    return problems


def _cycle(n: int) -> str:
    return "-".join(map(str, [*range(n), 0])) if n > 2 else "0-1"


def _twin_count_problems(c: Cluster, edge: str, ends: tuple[tuple[int, int], ...]) -> list[Problem]:
    """Twin t of one end talks to twin t of the other: both ends list as many twins."""
    (a, pa), (b, pb) = ends
    na, nb = (len(c.ranks[i].ring_ports[p].twins) for i, p in ends)
    if na == nb:
        return []
    return [
        Problem(
            _port_path(b, pb, "twins"),
            f"{nb} twin(s), but the other end of cable {edge} (ranks[{a}].ring_ports[{pa}]) has {na}: "
            "both ends of a cable list the same twins",
        )
    ]


def _cage_problems(c: Cluster, edge: str, cable: int, ends: tuple[tuple[int, int], ...]) -> list[Problem]:
    expected = cable_cage(cable, len(c.ranks))
    problems = []
    for i, p in ends:
        cage = c.ranks[i].ring_ports[p].cage
        if expected is not None and cage != expected:
            problems.append(
                Problem(
                    _port_path(i, p, "cage"),
                    f"cable {edge} (ranks {cable}-{(cable + 1) % len(c.ranks)}) must use cage {expected} on both "
                    f"ends (cage matching), got {cage}: swap the two cables in rank {i}'s cages so that {edge} "
                    f"sits in cage {expected}, or correct the inventory if it mis-states them",
                )
            )
    return problems


# ---------------------------------------------------------------------------------------------
# Entry points: validate data, load a file.

_EXPECTED = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}

_EXPECTED_FROM_CTX = {
    "literal_error": "{expected}",
    "greater_than": "a value > {gt}",
    "greater_than_equal": "a value >= {ge}",
    "less_than_equal": "a value <= {le}",
    "too_short": "at least {min_length} item(s)",
    "too_long": "at most {max_length} item(s)",
}


def _path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (list indexes step into the item model)."""
    model: type[BaseModel] | None = Cluster
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        model = _nested_model(field.annotation) if field else None
    return model


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_nested_model, get_args(annotation))), None)


def _problems_from(error: ValidationError) -> list[Problem]:
    """Turn pydantic's errors into Problems in the user's terms: path, what is wrong, what is expected."""
    problems: list[Problem] = []
    for e in error.errors(include_url=False):
        loc, kind, ctx = e["loc"], e["type"], e.get("ctx", {})
        path = _path(loc) or "(document)"
        if kind == "ring":
            problems += ctx["problems"]
        elif kind == "sparkring":
            problems.append(Problem(path, ctx["message"]))
        elif kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            allowed = ", ".join(model.model_fields) if model else "none"
            problems.append(Problem(path, f"unknown key: expected only {allowed}"))
        elif kind == "missing":
            model = _model_at(loc[:-1])
            field = model.model_fields.get(str(loc[-1])) if model else None
            problems.append(Problem(path, f"required: {field.description if field else 'a value'}"))
        elif kind == "invalid_key":
            problems.append(
                Problem(_path(loc[:-1]) or "(document)", f"keys must be strings, got {_show(loc[-1])}")
            )
        elif kind in _EXPECTED:
            problems.append(Problem(path, f"expected {_EXPECTED[kind]}, got {_show(e['input'])}"))
        elif kind in _EXPECTED_FROM_CTX:
            expected = _EXPECTED_FROM_CTX[kind].format(**ctx)
            problems.append(Problem(path, f"expected {expected}, got {_show(e['input'])}"))
        else:
            problems.append(Problem(path, f"{e['msg']}, got {_show(e['input'])}"))
    return problems


def _strip_secrets(data: object, loc: tuple[int | str, ...], found: list[Problem]) -> object:
    """`data` without secret-looking keys, each reported in `found`: refused, never parsed."""
    if isinstance(data, dict):
        kept = {}
        for key, value in data.items():
            if isinstance(key, str) and is_secret_name(key):
                found.append(Problem(_path((*loc, key)), _SECRET_MESSAGE))
            else:
                kept[key] = _strip_secrets(value, (*loc, key), found)
        return kept
    if isinstance(data, list):
        return [_strip_secrets(item, (*loc, index), found) for index, item in enumerate(data)]
    return data


def validate_cluster(data: object) -> Cluster:
    """The validated cluster, or ClusterValidationError listing every problem."""
    problems: list[Problem] = []
    data = _strip_secrets(data, (), problems)
    try:
        cluster = Cluster.model_validate(data)
    except ValidationError as error:
        problems += _problems_from(error)
    if problems:
        raise ClusterValidationError(problems)
    return cluster


# cluster.yml is small and written out in full. What it never needs is refused while the file is
# composed, before anything is built from it: anchors and aliases (a 1 KB "billion laughs" file
# expands into billions of nodes), nesting deeper than any schema level, and files larger than any
# real ring's inventory (a 64-rank ring is about 50 KB).
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 16


class _ClusterLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases, deep nesting and duplicate keys, at their line.

    PyYAML would expand aliases and silently keep the last of two equal keys.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            shown = ("*" if isinstance(event, yaml.AliasEvent) else "&") + str(event.anchor)
            raise yaml.composer.ComposerError(
                None,
                None,
                f"anchors and aliases are not allowed in cluster.yml (found {shown}): write each value out",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"nested deeper than {MAX_DEPTH} levels: cluster.yml needs far fewer",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:
                duplicate = False  # unhashable: the base class reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
                )
            if not isinstance(key, list | dict):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_cluster_file(path: str | Path) -> Cluster:
    """Read and validate a cluster.yml; problems name the file position or the field path."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ClusterValidationError(
                [
                    Problem(
                        str(path), f"larger than {MAX_FILE_BYTES // 1024} KiB: expected a cluster inventory"
                    )
                ]
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ClusterValidationError([Problem(str(path), f"cannot read: {error}")]) from None
    try:
        data = yaml.load(text, Loader=_ClusterLoader)  # a SafeLoader subclass: safe
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(error, "problem", None) or str(error)
        raise ClusterValidationError([Problem(where, f"not valid YAML: {problem}")]) from None
    return validate_cluster(data)
