"""One targeted case per check: the exact lines a user sees for each kind of mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inventory_builders import DELETE, edit, load_inventory, sim_ring
from sparkring.cluster import ClusterValidationError, load_cluster_file, validate_cluster

SIM = load_inventory("sim")
RING4 = load_inventory("ring4")
PAIR = load_inventory("pair")

SWAPPED_CAGES = {"ranks[1].ring_ports[0].cage": 1, "ranks[1].ring_ports[1].cage": 0}
RDMA = {"device": "rocep1s0f0", "port": 1, "gid_index": 3}

CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("version", SIM, {"version": 3}, ["version: expected 2, got 3"]),
    (
        "version 1 says how to move to twins",
        SIM,
        {"version": 1},
        [
            "version: expected 2, got 1: version 2 describes each ring port's twins (a Spark cage is two "
            "netdev/RDMA functions): move the port's interface and rdma into twins: [{interface, rdma}, "
            "{interface, rdma}] and set version: 2"
        ],
    ),
    ("version is a bool", SIM, {"version": True}, ["version: expected an integer, got True"]),
    ("plugin name", SIM, {"plugin": "yaml"}, ["plugin: expected 'sparkring_cluster', got 'yaml'"]),
    (
        "unknown key",
        SIM,
        {"cluster.colour": "red"},
        ["cluster.colour: unknown key: expected only name, fabric, mtu, link_speed_mbps, management_subnet"],
    ),
    (
        "unknown top-level key",
        SIM,
        {"hosts": {}},
        ["hosts: unknown key: expected only plugin, version, cluster, ssh, edges, ranks"],
    ),
    (
        "missing key",
        SIM,
        {"cluster.fabric": DELETE},
        ['cluster.fabric: required: the ring transport fabric, "tcp" or "verbs"'],
    ),
    (
        "secrets",
        SIM,
        {"ranks[1].hf_token": "hf_x", "api_key": "k"},
        [
            "ranks[1].hf_token: looks like a secret: secrets never live in cluster.yml; supply them from Ansible "
            "Vault or the environment",
            "api_key: looks like a secret: secrets never live in cluster.yml; supply them from Ansible Vault "
            "or the environment",
        ],
    ),
    ("wrong type", SIM, {"ranks[1].rank": "1"}, ["ranks[1].rank: expected an integer, got '1'"]),
    (
        "fabric",
        SIM,
        {"cluster.fabric": "rdma"},
        ["cluster.fabric: expected 'tcp' or 'verbs', got 'rdma'"],
    ),
    (
        "mtu",
        SIM,
        {"cluster.mtu": 1500},
        ["cluster.mtu: expected 9000 (jumbo frames on every ring link), got 1500"],
    ),
    (
        "link speed",
        SIM,
        {"cluster.link_speed_mbps": 0},
        ["cluster.link_speed_mbps: expected a value > 0, got 0"],
    ),
    (
        "odd ring",
        SIM,
        {"ranks[3]": DELETE},
        ["ranks: expected 2 ranks (a pair on one cable) or an even number >= 4 (a ring), got 3"],
    ),
    (
        "ranks out of order",
        sim_ring(6),
        {"ranks[1].rank": 2, "ranks[2].rank": 1},
        [
            "ranks[1].rank: expected 1: ranks are listed in order 0..5, got 2",
            "ranks[2].rank: expected 2: ranks are listed in order 0..5, got 1",
        ],
    ),
    (
        "duplicate host and hostname",
        SIM,
        {"ranks[2].host": "R1", "ranks[3].hostname": "sim-r0"},
        [
            "ranks[2].host: also ranks[1].host: every rank is a different machine",
            "ranks[3].hostname: also ranks[0].hostname: every rank is a different machine",
        ],
    ),
    (
        "duplicate ssh target",
        RING4,
        {"ranks[1].ssh": {"host": "spark-3.mgmt.example.net", "port": 2222}},
        ["ranks[3].ssh.host: the same ssh target as ranks[1].ssh.host: every rank is a different machine"],
    ),
    (
        "edge subnet prefix",
        SIM,
        {"edges[0].subnet": "198.19.0.0/25"},
        ["edges[0].subnet: 198.19.0.0/25 is a /25: expected a /24, one per cable"],
    ),
    (
        "edge subnet host bits",
        SIM,
        {"edges[0].subnet": "198.19.0.1/24"},
        [
            "edges[0].subnet: '198.19.0.1/24': expected an IPv4 network with no host bits set, such as 198.51.100.0/24"
        ],
    ),
    (
        "edge subnet reused",
        SIM,
        {"edges[1].subnet": "198.19.0.0/24"},
        [
            "edges[1].subnet: also edges[0].subnet: every cable needs its own /24",
            "ranks[1].ring_ports[1].address: 198.19.1.1 is outside edge r1-r2 subnet 198.19.0.0/24",
            "ranks[2].ring_ports[1].address: 198.19.1.2 is outside edge r1-r2 subnet 198.19.0.0/24",
        ],
    ),
    (
        "address outside its edge",
        SIM,
        {"ranks[2].ring_ports[0].address": "198.19.3.7"},
        ["ranks[2].ring_ports[0].address: 198.19.3.7 is outside edge r2-r3 subnet 198.19.2.0/24"],
    ),
    (
        "broadcast address",
        SIM,
        {"ranks[2].ring_ports[0].address": "198.19.2.255"},
        [
            "ranks[2].ring_ports[0].address: 198.19.2.255 is not a host address of edge r2-r3 subnet "
            "198.19.2.0/24: expected .1-.254"
        ],
    ),
    (
        "address with a prefix",
        SIM,
        {"ranks[0].ring_ports[0].address": "198.19.0.1/24"},
        [
            "ranks[0].ring_ports[0].address: '198.19.0.1/24': expected a bare IPv4 address; the /24 comes from the edge"
        ],
    ),
    (
        "both ends one address",
        SIM,
        {"ranks[1].ring_ports[0].address": "198.19.0.1"},
        ["ranks[1].ring_ports[0].address: also ranks[0].ring_ports[0].address: every address is unique"],
    ),
    (
        "unknown edge",
        SIM,
        {"ranks[0].ring_ports[0].edge": "r0-r9"},
        [
            "ranks[0].ring_ports[0].edge: unknown edge 'r0-r9': expected one of r0-r1, r1-r2, r2-r3, r3-r0",
            "edges[0]: edge r0-r1 is claimed by ranks[1].ring_ports[0]: expected exactly one port on each of two "
            "different ranks",
            "edges: no edge joins ranks 0 and 1: expected one edge per cable of the cycle 0-1-2-3-0",
        ],
    ),
    (
        "unclaimed edge",
        SIM,
        {"edges[4]": {"id": "spare", "subnet": "198.19.9.0/24"}},
        [
            "edges[4]: edge spare is claimed by no ring port: expected exactly one port on each of two different ranks"
        ],
    ),
    (
        "both ports on one cable and cage",
        SIM,
        {
            "ranks[0].ring_ports[1].edge": "r0-r1",
            "ranks[0].ring_ports[1].address": "198.19.0.3",
            "ranks[0].ring_ports[1].cage": 0,
        },
        [
            "ranks[0].ring_ports[1].edge: same as ranks[0].ring_ports[0].edge: a rank's two ports sit on different cables",
            "ranks[0].ring_ports[1].cage: same as ranks[0].ring_ports[0].cage: a rank's two ports sit in different "
            "cages (0 and 1)",
            "edges[0]: edge r0-r1 is claimed by ranks[0].ring_ports[0], ranks[0].ring_ports[1], "
            "ranks[1].ring_ports[0]: expected exactly one port on each of two different ranks",
            "edges[3]: edge r3-r0 is claimed by ranks[3].ring_ports[1]: expected exactly one port on each of two "
            "different ranks",
            "edges: no edge joins ranks 0 and 1: expected one edge per cable of the cycle 0-1-2-3-0",
            "edges: no edge joins ranks 3 and 0: expected one edge per cable of the cycle 0-1-2-3-0",
        ],
    ),
    (
        "cage matching",
        SIM,
        SWAPPED_CAGES,
        [
            "ranks[1].ring_ports[0].cage: cable r0-r1 (ranks 0-1) must use cage 0 on both ends (cage matching), "
            "got 1: swap the two cables in rank 1's cages so that r0-r1 sits in cage 0, or correct the inventory "
            "if it mis-states them",
            "ranks[1].ring_ports[1].cage: cable r1-r2 (ranks 1-2) must use cage 1 on both ends (cage matching), "
            "got 0: swap the two cables in rank 1's cages so that r1-r2 sits in cage 1, or correct the inventory "
            "if it mis-states them",
        ],
    ),
    (
        "cage range",
        SIM,
        {"ranks[0].ring_ports[0].cage": 2},
        ["ranks[0].ring_ports[0].cage: expected a value <= 1, got 2"],
    ),
    (
        "pair ports",
        PAIR,
        {
            "ranks[1].ring_ports[1]": {
                "cage": 1,
                "edge": "spark0-spark1",
                "address": "198.51.100.3",
                "twins": [{"interface": "enp1s0f1np1", "rdma": {**RDMA, "device": "rocep1s0f1"}}],
            }
        },
        [
            "ranks[1].ring_ports: a pair rank has one ring port (one cable), got 2",
            "ranks[1].ring_ports[1].edge: same as ranks[1].ring_ports[0].edge: a rank's two ports sit on different cables",
            "edges[0]: edge spark0-spark1 is claimed by ranks[0].ring_ports[0], ranks[1].ring_ports[0], "
            "ranks[1].ring_ports[1]: expected exactly one port on each of two different ranks",
            "edges: no edge joins ranks 0 and 1: expected one edge per cable of the cycle 0-1",
        ],
    ),
    (
        "verbs needs rdma",
        SIM,
        {"cluster.fabric": "verbs"}
        | {
            f"ranks[{r}].ring_ports[{p}].twins[{t}].rdma": {
                **RDMA,
                "device": f"roce{t}p1s0f{p}",
                "gid_index": 3 if t == 0 else "auto",
            }
            for r in range(4)
            for p in range(2)
            for t in range(2)
            if (r, p, t) != (2, 1, 1)
        },
        [
            "ranks[2].ring_ports[1].twins[1].rdma: required when cluster.fabric is verbs: {device, port, gid_index}"
        ],
    ),
    (
        "rdma fields",
        RING4,
        {
            "ranks[0].ring_ports[0].twins[0].rdma.port": 0,
            "ranks[0].ring_ports[1].twins[1].rdma.gid_index": "3",
            "ranks[1].ring_ports[0].twins[0].rdma.device": "mlx5/0",
        },
        [
            "ranks[0].ring_ports[0].twins[0].rdma.port: expected a value >= 1, got 0",
            "ranks[0].ring_ports[1].twins[1].rdma.gid_index: '3': expected \"auto\" or a RoCE v2 GID index 0-255 "
            "(a RoCE GID table has at most 256 entries)",
            "ranks[1].ring_ports[0].twins[0].rdma.device: 'mlx5/0' is not a valid RDMA device name: expected 1-64 of A-Z a-z "
            "0-9 _ . -, such as rocep1s0f0",
        ],
    ),
    (
        # The field's case: path B (the domain-2 function) listed first, so the inventory puts the
        # address on it, and the address GID's index (3 on DGX OS) left on path A, now the twin
        # without an address, whose GID table holds only link-local GIDs.
        "a fixed gid_index on the twin without the address",
        RING4,
        {
            "ranks[1].ring_ports[0].twins": [
                {
                    "interface": "enP2p1s0f0np0",
                    "rdma": {"device": "roceP2p1s0f0", "port": 1, "gid_index": "auto"},
                },
                {"interface": "enp1s0f0np0", "rdma": {"device": "rocep1s0f0", "port": 1, "gid_index": 3}},
            ]
        },
        [
            "ranks[1].ring_ports[0].twins[1].rdma.gid_index: 3 on a twin that carries no address: only the first "
            "twin (enP2p1s0f0np0) carries 198.18.0.2 and its IPv4-mapped GID; this twin's RDMA uses its "
            "link-local RoCE v2 GID. Set gid_index: auto here, or, if enp1s0f0np0 is the function that carries "
            "the address, list it first in twins"
        ],
    ),
    (
        "gid_index past a RoCE GID table",
        RING4,
        {"ranks[3].ring_ports[0].twins[0].rdma.gid_index": 300},
        [
            'ranks[3].ring_ports[0].twins[0].rdma.gid_index: 300: expected "auto" or a RoCE v2 GID index 0-255 '
            "(a RoCE GID table has at most 256 entries)"
        ],
    ),
    (
        "rdma device reused",
        RING4,
        {"ranks[2].ring_ports[1].twins[1].rdma.device": "roceP2p1s0f0"},
        [
            "ranks[2].ring_ports[1].twins[1].rdma: the same RDMA device and port as "
            "ranks[2].ring_ports[0].twins[1].rdma: every twin has its own"
        ],
    ),
    (
        "twins of one cable differ in number",
        RING4,
        {"ranks[1].ring_ports[1].twins[1]": DELETE},
        [
            "ranks[2].ring_ports[1].twins: 2 twin(s), but the other end of cable spark1-spark2 "
            "(ranks[1].ring_ports[1]) has 1: both ends of a cable list the same twins"
        ],
    ),
    (
        "a cage has at most two twins",
        SIM,
        {"ranks[0].ring_ports[0].twins[2]": {"interface": "ring0c"}},
        [
            "ranks[0].ring_ports[0].twins: expected at most 2 item(s), got [{'interface': 'ring0'}, {'interface': 'ring0b'}, {'inter..."
        ],
    ),
    (
        "every twin has its own interface",
        SIM,
        {"ranks[1].ring_ports[1].twins[1].interface": "ring0b"},
        [
            "ranks[1].ring_ports[1].twins[1].interface: also ranks[1].ring_ports[0].twins[1].interface: every twin "
            "of every port of a rank has its own interface",
        ],
    ),
    (
        "a port without twins",
        SIM,
        {"ranks[3].ring_ports[0].twins": []},
        ["ranks[3].ring_ports[0].twins: expected at least 1 item(s), got []"],
    ),
    (
        "management address",
        SIM,
        {
            "ranks[0].management.address": "198.19.253.10/24",
            "ranks[1].management.address": "198.19.254.11/16",
            "ranks[2].management.address": "198.19.254.10/24",
            "ranks[3].management.address": "198.19.254.13",
        },
        [
            "ranks[3].management.address: '198.19.254.13': expected an IPv4 address with its prefix, such as "
            "192.0.2.10/24",
        ],
    ),
    (
        "management address placement",
        SIM,
        {
            "ranks[0].management.address": "198.19.253.10/24",
            "ranks[1].management.address": "198.19.254.11/16",
            "ranks[2].management.address": "198.19.254.10/24",
            "ranks[3].management.address": "198.19.254.255/24",
        },
        [
            "ranks[0].management.address: 198.19.253.10 is outside cluster.management_subnet 198.19.254.0/24",
            "ranks[1].management.address: prefix /16 differs from cluster.management_subnet 198.19.254.0/24",
            "ranks[3].management.address: 198.19.254.255 is not a host address of 198.19.254.0/24",
        ],
    ),
    (
        "management address reused",
        SIM,
        {"ranks[2].management.address": "198.19.254.10/24"},
        ["ranks[2].management.address: also ranks[0].management.address: every address is unique"],
    ),
    (
        "management inside the ring",
        SIM,
        {"cluster.management_subnet": "198.19.0.0/16", "ranks[0].management.address": "198.19.0.9/16"},
        [
            "edges[0].subnet: 198.19.0.0/24 overlaps cluster.management_subnet 198.19.0.0/16: expected ring "
            "subnets disjoint from the management network",
            "edges[1].subnet: 198.19.1.0/24 overlaps cluster.management_subnet 198.19.0.0/16: expected ring "
            "subnets disjoint from the management network",
            "edges[2].subnet: 198.19.2.0/24 overlaps cluster.management_subnet 198.19.0.0/16: expected ring "
            "subnets disjoint from the management network",
            "edges[3].subnet: 198.19.3.0/24 overlaps cluster.management_subnet 198.19.0.0/16: expected ring "
            "subnets disjoint from the management network",
            "ranks[0].management.address: 198.19.0.9 is inside edge r0-r1 subnet 198.19.0.0/24: expected outside "
            "every ring subnet",
            "ranks[1].management.address: prefix /24 differs from cluster.management_subnet 198.19.0.0/16",
            "ranks[2].management.address: prefix /24 differs from cluster.management_subnet 198.19.0.0/16",
            "ranks[3].management.address: prefix /24 differs from cluster.management_subnet 198.19.0.0/16",
        ],
    ),
    (
        "management interface is a ring port",
        SIM,
        {"ranks[0].management.interface": "ring1"},
        [
            "ranks[0].ring_ports[1].twins[0].interface: also ranks[0].management.interface: every twin of every "
            "port of a rank has its own interface"
        ],
    ),
    (
        "shell characters",
        SIM,
        {
            "ssh.user": "root;id",
            "ssh.proxy_command": "nc %h %p; rm -rf /",
            "ssh.private_key_file": "id_ed25519",
            "ssh.python_interpreter": "python3",
            "ranks[0].host": "r0 r1",
            "ranks[0].hostname": "sim_r0",
            "ranks[1].ssh": {"host": "$(reboot)", "port": 70000},
            "ranks[2].ring_ports[0].twins[0].interface": "ring0`id`",
            "ranks[3].management.interface": "mgmt0-too-long-x",
        },
        [
            "ssh.user: 'root;id' is not a valid ssh user: expected 1-32 of A-Z a-z 0-9 _ . -, not starting with a digit",
            "ssh.private_key_file: 'id_ed25519' is not a valid file path: expected an absolute or ~/ path of A-Z a-z "
            "0-9 _ . + / -",
            "ssh.proxy_command: 'nc %h %p; rm -rf /' is not a valid ssh ProxyCommand: expected up to 256 of A-Z a-z "
            "0-9 space _ . / % @ = + , : - (no quotes or shell operators)",
            "ssh.python_interpreter: 'python3' is not a valid interpreter path: expected an absolute path",
            "ranks[0].host: 'r0 r1' is not a valid hostname: expected RFC 1123 labels (letters, digits, '-', 1-63 "
            "characters each, not starting or ending with '-') joined by '.'",
            "ranks[0].hostname: 'sim_r0' is not a valid hostname: expected RFC 1123 labels (letters, digits, '-', "
            "1-63 characters each, not starting or ending with '-') joined by '.'",
            "ranks[1].ssh.host: '$(reboot)' is not a valid hostname: expected RFC 1123 labels (letters, digits, '-', "
            "1-63 characters each, not starting or ending with '-') joined by '.'",
            "ranks[1].ssh.port: expected a value <= 65535, got 70000",
            "ranks[2].ring_ports[0].twins[0].interface: 'ring0`id`' is not a valid interface name: expected 1-15 of A-Z a-z "
            "0-9 _ . : -, starting alphanumeric (Linux IFNAMSIZ)",
            "ranks[3].management.interface: 'mgmt0-too-long-x' is not a valid interface name: expected 1-15 of A-Z "
            "a-z 0-9 _ . : -, starting alphanumeric (Linux IFNAMSIZ)",
        ],
    ),
    (
        "ssh host as an address",
        SIM,
        {"ranks[0].ssh": {"host": "198.19.254.300"}},
        [
            "ranks[0].ssh.host: '198.19.254.300' is not an IPv4 address: expected a dotted quad such as 198.51.100.1",
        ],
    ),
]


def problems(data: object) -> list[str]:
    try:
        validate_cluster(data)
    except ClusterValidationError as error:
        assert str(error) == "\n".join(map(str, error.problems)), "one problem per line"
        return [str(p) for p in error.problems]
    return []


@pytest.mark.parametrize(("base", "changes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_check_names_the_field_and_what_is_expected(
    base: dict, changes: dict, expected: list[str]
) -> None:
    assert problems(edit(base, changes)) == expected


def test_edge_between_non_neighbours() -> None:
    # Ranks 1 and 2 exchange their cabling: r0-r1 now ends on ranks 0 and 2.
    data = edit(
        SIM,
        {
            "ranks[1].ring_ports": SIM["ranks"][2]["ring_ports"],
            "ranks[2].ring_ports": SIM["ranks"][1]["ring_ports"],
        },
    )
    found = problems(data)
    assert (
        "edges[0]: edge r0-r1 joins ranks 0 and 2, which are not ring neighbours: expected the cycle 0-1-2-3-0"
        in found
    )
    assert "edges: no edge joins ranks 0 and 1: expected one edge per cable of the cycle 0-1-2-3-0" in found


def test_non_string_key() -> None:
    data = edit(SIM, {})
    data["ssh"][5] = "x"
    assert problems(data) == ["ssh: keys must be strings, got 5"]


@pytest.mark.parametrize("document", [None, [], "cluster", 1])
def test_document_must_be_a_mapping(document: object) -> None:
    (found,) = problems(document)
    assert found.startswith("(document): expected a mapping, got ")


def test_every_problem_is_reported_at_once() -> None:
    data = edit(
        SIM,
        {"cluster.mtu": 1500, "ssh.user": "a b", "edges[2].subnet": "198.19.2.0/23", "ranks[0].colour": 1},
    )
    assert [p.split(":")[0] for p in problems(data)] == [
        "cluster.mtu",
        "ssh.user",
        "edges[2].subnet",
        "ranks[0].colour",
    ]


def test_valid_variants() -> None:
    assert (
        problems(edit(SIM, {"cluster.link_speed_mbps": None, "plugin": DELETE, "ssh.proxy_command": DELETE}))
        == []
    )
    assert problems(edit(PAIR, {"ranks[0].ring_ports[0].cage": 1})) == [], "a pair keeps no cage matching"
    assert problems(edit(RING4, {"ranks[0].ring_ports[0].twins[0].rdma.gid_index": "auto"})) == []


def test_yaml_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text("version: 1\ncluster:\n  mtu: 9000\n  mtu: 1500\n", encoding="utf-8")
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(path)
    assert str(caught.value) == f"{path}:4:3: not valid YAML: duplicate key 'mtu' (first on line 3)"


def test_yaml_syntax_errors_name_the_position(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text("version: 1\ncluster: [\n", encoding="utf-8")
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(path)
    assert str(caught.value).startswith(f"{path}:3:1: not valid YAML: ")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(tmp_path / "cluster.yml")
    assert str(caught.value).startswith(f"{tmp_path / 'cluster.yml'}: cannot read: ")


@pytest.mark.parametrize(
    ("text", "where", "found"),
    [
        # A "billion laughs": nine aliases per level, eight levels, ~500 bytes.
        (
            'version: 1\na0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
            + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
            + "cluster: *a8\n",
            "2:5",
            "&a0",
        ),
        ("version: 1\ncluster:\n  mtu: 9000\nssh: *mtu\n", "4:6", "*mtu"),
        ("cluster: &c {mtu: 9000}\n", "1:10", "&c"),
    ],
)
def test_yaml_anchors_and_aliases_are_refused(tmp_path: Path, text: str, where: str, found: str) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(path)
    assert str(caught.value) == (
        f"{path}:{where}: not valid YAML: anchors and aliases are not allowed in cluster.yml "
        f"(found {found}): write each value out"
    )


def test_yaml_nesting_and_size_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text("version: " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(path)
    assert (
        str(caught.value)
        == f"{path}:1:25: not valid YAML: nested deeper than 16 levels: cluster.yml needs far fewer"
    )
    path.write_text("version: 1\n" + "# padding\n" * 30_000, encoding="utf-8")
    with pytest.raises(ClusterValidationError) as caught:
        load_cluster_file(path)
    assert str(caught.value) == f"{path}: larger than 256 KiB: expected a cluster inventory"
