"""Fuzz the schema with >= 10,000 malformed inventories: mutations of the valid ones.

Every mutation below is built to break the inventory (a dropped required key, an unknown or
secret key, a wrong type, a bad address, cage, rank list, edge, integer, shell metacharacter,
...) and returns the locations it broke. The schema must reject each one with its own error
only (anything else is a crash); one of the problems must name a location the mutation broke
(or its parent: a mapping missing a key, a list that lost an item), and every problem must
name a field path that exists in the mutated document (or the missing key of a mapping that
exists).
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inventory_builders import INVENTORIES, load_inventory, parse_path, sim_ring
from sparkring.cluster import ClusterValidationError, validate_cluster

EXAMPLES = 10_000
VALID = {name: load_inventory(name) for name in INVENTORIES} | {"ring6": sim_ring(6)}
OPTIONAL = re.compile(
    r"plugin|ssh\.(port|private_key_file|known_hosts_file|proxy_command|python_interpreter)|ranks\[\d+\]\.ssh(\..+)?"
)
METACHARACTERS = list(";|&$`'\"<>(){}[]*?!\\#^\n\t")
SECRET_KEYS = ["password", "hf_token", "HF_TOKEN", "api_key", "apiKey", "secret", "private_key", "passphrase"]
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
SCALARS = st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.booleans(), NAMES)
JSON = st.recursive(
    SCALARS | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=6,
)

Draw = Callable[[st.SearchStrategy[Any]], Any]
Loc = tuple[str | int, ...]
Mutated = tuple[Any, set[Loc]]  # the malformed document and the locations the mutation broke
DOCUMENT: Loc = ()  # the whole document (not a mapping)


def nodes(data: Any, loc: Loc = ()) -> list[tuple[Loc, Any]]:
    """Every (location, value) below the root, depth first."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    found: list[tuple[Loc, Any]] = []
    for key, value in items:
        found.append(((*loc, key), value))
        found += nodes(value, (*loc, key))
    return found


def path_of(loc: Loc) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def at(data: Any, loc: Loc) -> Any:
    for part in loc:
        data = data[part]
    return data


def parent_of(data: Any, loc: Loc) -> Any:
    return at(data, loc[:-1])


def pick(draw: Draw, data: dict[str, Any], keep: Callable[[Loc, Any], bool]) -> Loc:
    return draw(st.sampled_from([loc for loc, value in nodes(data) if keep(loc, value)]))


def twins(data: dict[str, Any]) -> list[Loc]:
    return [(*loc, "twins", t) for loc in ports(data) for t in range(len(at(data, loc)["twins"]))]


def ports(data: dict[str, Any]) -> list[Loc]:
    return [
        ("ranks", r, "ring_ports", p)
        for r, rank in enumerate(data["ranks"])
        for p in range(len(rank["ring_ports"]))
    ]


# --- mutations: each takes draw and a private copy, returns the document and what it broke --


def drop_required_key(draw: Draw, data: dict[str, Any]) -> Mutated:
    tcp = data["cluster"]["fabric"] == "tcp"

    def required(loc: Loc, _: Any) -> bool:
        return (
            isinstance(loc[-1], str)
            and not OPTIONAL.fullmatch(path_of(loc))
            and not (tcp and loc[-1] == "rdma")
        )

    loc = pick(draw, data, required)
    del parent_of(data, loc)[loc[-1]]
    return data, {loc}


def rename_key(draw: Draw, data: dict[str, Any]) -> Mutated:
    loc = pick(draw, data, lambda loc, _: isinstance(loc[-1], str))
    parent, renamed = parent_of(data, loc), "x_" + draw(NAMES)
    parent[renamed] = parent.pop(loc[-1])
    return data, {loc, (*loc[:-1], renamed)}


def add_key(draw: Draw, data: dict[str, Any]) -> Mutated:
    mappings = [DOCUMENT] + [loc for loc, value in nodes(data) if isinstance(value, dict)]
    loc = draw(st.sampled_from(mappings))
    key = draw(st.sampled_from(SECRET_KEYS) | NAMES.map(lambda name: "x_" + name))
    at(data, loc)[key] = draw(JSON)
    return data, {(*loc, key)}


def _kind(value: Any) -> str:
    return type(value).__name__


def wrong_type(draw: Draw, data: dict[str, Any]) -> Mutated:
    loc = pick(draw, data, lambda loc, value: True)
    original = _kind(parent_of(data, loc)[loc[-1]])
    replacements = {
        "int": st.integers(-5, 10**6),
        "str": NAMES.map(lambda name: "x" + name),
        "bool": st.booleans(),
        "float": st.floats(allow_nan=False),
        "list": st.lists(SCALARS, max_size=2),
        "dict": st.dictionaries(NAMES, SCALARS, max_size=2),
    }
    accepted = {"int", "str"} if loc[-1] == "gid_index" else {original}  # an index or "auto"
    kind = draw(st.sampled_from(sorted(set(replacements) - accepted)))
    parent_of(data, loc)[loc[-1]] = draw(replacements[kind])
    return data, {loc}


def _outside(address: str, subnet: str) -> str:
    ip = ipaddress.IPv4Address(address.split("/")[0])
    flipped = ipaddress.IPv4Address(int(ip) ^ (1 << 8))  # another /24
    assert flipped not in ipaddress.IPv4Network(subnet)
    return str(flipped)


def bad_ring_address(draw: Draw, data: dict[str, Any]) -> Mutated:
    loc = draw(st.sampled_from(ports(data)))
    port = at(data, loc)
    subnet = next(e["subnet"] for e in data["edges"] if e["id"] == port["edge"])
    network = ipaddress.IPv4Network(subnet)
    peer_loc = next(
        other for other in ports(data) if at(data, other)["edge"] == port["edge"] and other != loc
    )
    peer = at(data, peer_loc)
    port["address"] = draw(
        st.sampled_from(
            [
                _outside(port["address"], subnet),
                str(network.network_address),
                str(network.broadcast_address),
                port["address"] + "/24",
                peer["address"],
                "198.19.0",
                "198.19.0.256",
                "::1",
                "",
            ]
        )
    )
    # A copy of the peer's address breaks both ends: either may be the one named.
    return data, {(*loc, "address"), (*peer_loc, "address")}


def bad_management_address(draw: Draw, data: dict[str, Any]) -> Mutated:
    ranks = data["ranks"]
    index = draw(st.integers(0, len(ranks) - 1))
    management = ranks[index]["management"]
    neighbour = (index + 1) % len(ranks)
    subnet = ipaddress.IPv4Network(data["cluster"]["management_subnet"])
    ring = ipaddress.IPv4Network(data["edges"][0]["subnet"])
    management["address"] = draw(
        st.sampled_from(
            [
                _outside(management["address"], str(subnet)) + f"/{subnet.prefixlen}",
                ranks[neighbour]["management"]["address"],
                management["address"].split("/")[0],
                management["address"].split("/")[0] + "/16",
                f"{subnet.network_address}/{subnet.prefixlen}",
                f"{subnet.broadcast_address}/{subnet.prefixlen}",
                f"{ring.network_address + 77}/{subnet.prefixlen}",
            ]
        )
    )
    # The neighbour's address breaks both: either may be the one named.
    return data, {("ranks", index, "management", "address"), ("ranks", neighbour, "management", "address")}


def bad_cage(draw: Draw, data: dict[str, Any]) -> Mutated:
    index = draw(st.integers(0, len(data["ranks"]) - 1))
    ring_ports = data["ranks"][index]["ring_ports"]
    choices = ["out of range"] + (["swap", "same"] if len(data["ranks"]) >= 4 else [])
    choice = draw(st.sampled_from(choices))
    cages = {("ranks", index, "ring_ports", p, "cage") for p in (0, 1)}
    if choice == "swap":
        ring_ports[0]["cage"], ring_ports[1]["cage"] = ring_ports[1]["cage"], ring_ports[0]["cage"]
    elif choice == "same":
        ring_ports[1]["cage"] = ring_ports[0]["cage"]
    else:
        port = draw(st.integers(0, len(ring_ports) - 1))
        ring_ports[port]["cage"] = draw(st.integers(-3, 9).filter(lambda cage: cage not in (0, 1)))
        cages = {("ranks", index, "ring_ports", port, "cage")}
    return data, cages


def bad_rank_list(draw: Draw, data: dict[str, Any]) -> Mutated:
    ranks = data["ranks"]
    choice = draw(st.sampled_from(["drop", "duplicate", "shuffle"]))
    if choice == "drop":
        del ranks[draw(st.integers(0, len(ranks) - 1))]
        return data, {("ranks",)}
    if choice == "duplicate":
        ranks.append(copy.deepcopy(draw(st.sampled_from(ranks))))
        return data, {("ranks", len(ranks) - 1, "rank")}
    order = draw(st.permutations(range(len(ranks))).filter(lambda order: list(order) != sorted(order)))
    data["ranks"] = [ranks[i] for i in order]
    return data, {("ranks", position, "rank") for position, i in enumerate(order) if position != i}


def shell_metacharacter(draw: Draw, data: dict[str, Any]) -> Mutated:
    loc = pick(draw, data, lambda loc, value: isinstance(value, str))
    value = parent_of(data, loc)[loc[-1]]
    at = draw(st.integers(0, len(value)))
    parent_of(data, loc)[loc[-1]] = value[:at] + draw(st.sampled_from(METACHARACTERS)) + value[at:]
    return data, {loc}


def empty_string(draw: Draw, data: dict[str, Any]) -> Mutated:
    loc = pick(draw, data, lambda loc, value: isinstance(value, str))
    parent_of(data, loc)[loc[-1]] = ""
    return data, {loc}


BAD_INTEGERS = {
    "version": st.integers(-3, 9).filter(lambda v: v != 2),
    "mtu": st.integers(0, 70000).filter(lambda v: v != 9000),
    "link_speed_mbps": st.integers(-(10**6), 0),
    "port": st.sampled_from([0, -22, 65536, 10**6]),
    "gid_index": st.integers(-(2**31), -1) | st.integers(256, 2**31),
    "cage": st.integers(-3, 9).filter(lambda v: v not in (0, 1)),
}


def bad_integer(draw: Draw, data: dict[str, Any]) -> Mutated:
    def is_int(loc: Loc, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and loc[-1] in (*BAD_INTEGERS, "rank")

    loc = pick(draw, data, is_int)
    if loc[-1] == "rank":
        wrong = draw(st.integers(-3, 99).filter(lambda v: v != loc[1]))
    else:
        wrong = draw(BAD_INTEGERS[str(loc[-1])])
    parent_of(data, loc)[loc[-1]] = wrong
    return data, {loc}


def bad_edge(draw: Draw, data: dict[str, Any]) -> Mutated:
    edges = data["edges"]
    choices = ["prefix", "drop", "duplicate"] + (["repoint", "same subnet"] if len(edges) > 1 else [])
    choice = draw(st.sampled_from(choices))
    index = draw(st.integers(0, len(edges) - 1))
    edge = edges[index]
    if choice == "prefix":
        prefix = draw(st.sampled_from([16, 22, 23, 25, 30]))
        edge["subnet"] = str(ipaddress.IPv4Network(f"{edge['subnet'].split('/')[0]}/{prefix}", strict=False))
        return data, {("edges", index, "subnet")}
    if choice == "drop":
        del edges[index]  # the list lost a cable, and the ports on it name an edge that is gone
        return data, {("edges",)} | {
            (*loc, "edge") for loc in ports(data) if at(data, loc)["edge"] == edge["id"]
        }
    if choice == "duplicate":
        edges.append(copy.deepcopy(edge))
        return data, {("edges", len(edges) - 1, "id")}
    if choice == "repoint":
        loc = draw(st.sampled_from(ports(data)))
        port = at(data, loc)
        port["edge"] = draw(st.sampled_from([e["id"] for e in edges if e["id"] != port["edge"]]))
        # The port's address now lies outside its edge's /24: the schema names the address (DESIGN 3.1).
        return data, {(*loc, "edge"), (*loc, "address")}
    other = next(i for i in range(len(edges)) if i != index)
    edge["subnet"] = edges[other]["subnet"]  # two cables on one subnet: either may be the one named
    return data, {("edges", index, "subnet"), ("edges", other, "subnet")}


def fabric_without_rdma(draw: Draw, data: dict[str, Any]) -> Mutated:
    if data["cluster"]["fabric"] == "tcp":
        data["cluster"]["fabric"] = "verbs"  # no twin has an rdma section: each lacks one
        return data, {("cluster", "fabric")} | {(*loc, "rdma") for loc in twins(data)}
    loc = draw(st.sampled_from(twins(data)))
    del at(data, loc)["rdma"]
    return data, {(*loc, "rdma")}


def management_over_ring(draw: Draw, data: dict[str, Any]) -> Mutated:
    subnet = draw(st.sampled_from(["198.0.0.0/8", data["edges"][0]["subnet"]]))
    data["cluster"]["management_subnet"] = subnet
    # The new subnet breaks its relation to every ring subnet it overlaps (either side may be named)
    # and to every management address it no longer holds.
    network = ipaddress.IPv4Network(subnet)
    overlapped = {
        ("edges", i, "subnet")
        for i, e in enumerate(data["edges"])
        if network.overlaps(ipaddress.IPv4Network(e["subnet"]))
    }
    orphaned = {
        ("ranks", i, "management", "address")
        for i, rank in enumerate(data["ranks"])
        if ipaddress.IPv4Interface(rank["management"]["address"]).ip not in network
    }
    return data, {("cluster", "management_subnet")} | overlapped | orphaned


def not_a_mapping(draw: Draw, data: dict[str, Any]) -> Mutated:
    document = draw(st.one_of(SCALARS, st.none(), st.lists(SCALARS, max_size=3), st.just(list(data.items()))))
    return document, {DOCUMENT}


MUTATIONS = [
    drop_required_key,
    rename_key,
    add_key,
    wrong_type,
    bad_ring_address,
    bad_management_address,
    bad_cage,
    bad_rank_list,
    shell_metacharacter,
    empty_string,
    bad_integer,
    bad_edge,
    fabric_without_rdma,
    management_over_ring,
    not_a_mapping,
]


def names_what_broke(path: str, broken: set[Loc]) -> bool:
    """The path is a location the mutation broke, or the parent of one."""
    if path == "(document)":
        return DOCUMENT in broken
    loc = tuple(parse_path(path))
    return any(loc in (target, target[:-1]) for target in broken if target)


def names_a_field(document: Any, path: str) -> bool:
    """The path leads into the document, or to a missing key of a mapping in it."""
    if path == "(document)":
        return not isinstance(document, dict)
    node, parts = document, parse_path(path)
    for position, part in enumerate(parts):
        in_mapping = isinstance(node, dict) and part in node
        if in_mapping or (isinstance(node, list) and isinstance(part, int) and part < len(node)):
            node = node[part]
        else:
            return position == len(parts) - 1 and isinstance(node, dict) and isinstance(part, str)
    return bool(parts)


def test_malformed_inventories_are_rejected_naming_what_broke() -> None:
    rejected: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(name=st.sampled_from(sorted(VALID)), mutation=st.sampled_from(MUTATIONS), data=st.data())
    def check(name: str, mutation: Callable[[Draw, dict[str, Any]], Mutated], data: st.DataObject) -> None:
        document, broken = mutation(data.draw, copy.deepcopy(VALID[name]))
        with pytest.raises(ClusterValidationError) as caught:
            validate_cluster(document)
        problems = caught.value.problems
        assert problems
        assert any(names_what_broke(problem.path, broken) for problem in problems), (
            f"{mutation.__name__} broke {sorted(map(path_of, broken))}; the rejection names {problems}"
        )
        for problem in problems:
            assert names_a_field(document, problem.path), problem
            assert problem.message and "\n" not in problem.message, problem
        rejected.append(mutation.__name__)

    check()
    assert len(rejected) >= EXAMPLES
    assert {m.__name__ for m in MUTATIONS} == set(rejected), "every kind of mutation ran"


def test_a_rejection_that_names_another_existing_field_does_not_count() -> None:
    # What the fuzz accepted before: any path present in the document, wherever the break was.
    document, broken = copy.deepcopy(VALID["sim"]), {("ranks", 2, "management", "address")}
    assert names_a_field(document, "cluster.name")
    assert not names_what_broke("cluster.name", broken)
    assert not names_what_broke("ranks[2].ring_ports[0].address", broken)
    assert names_what_broke("ranks[2].management.address", broken)
    assert names_what_broke("ranks[2].management", broken)  # the parent
