"""module_utils/sparkring_ring_checks: one rule per ring-port check, for preflight (PF-) and qualification (CQ-).

Each check runs on facts (links, addresses, sysfs GID tables built here as the kernel shows
them) and yields the same rule under either prefix; a port is a cage with two twins, the first
carrying the address and its IPv4-mapped RoCE v2 GID, the second none and a link-local GID.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

# Rank 1's port on cable r1-r2 of the sim (cage 1 on both ends), with its two twins.
PORT = {
    "cage": 1,
    "interface": "ring1",
    "edge": "r1-r2",
    "address": "198.19.1.1",
    "prefix": 24,
    "twins": [
        {
            "interface": "ring1",
            "address": "198.19.1.1",
            "rdma_device": "rocep1s0f1",
            "rdma_port": 1,
            "gid_index": "auto",
        },
        {
            "interface": "ring1b",
            "address": None,
            "rdma_device": "roceP2p1s0f1",
            "rdma_port": 1,
            "gid_index": "auto",
        },
    ],
    "peer_rank": 2,
    "peer_host": "r2",
    "peer_address": "198.19.1.2",
    "peer_interface": "ring1",
    "peer_cage": 1,
}
EDGE = "r1 cage1 <-> r2 cage1"
ZERO = ":".join(["0000"] * 8)
LINK_LOCAL = {
    0: ("fe80:0000:0000:0000:5054:00ff:fe53:5201", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:5054:00ff:fe53:5201", "RoCE v2"),
}
IPV4 = {
    2: ("0000:0000:0000:0000:0000:ffff:c613:0101", "IB/RoCE v1"),
    3: ("0000:0000:0000:0000:0000:ffff:c613:0101", "RoCE v2"),
}


def rdma_port(root: Path, device: str, netdev: str, entries: dict, state: str = "4: ACTIVE", slots: int = 8):
    """One RDMA port as sysfs shows it: a slot per table entry, the empty ones all zeros."""
    port = root / "class" / "infiniband" / device / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    for index in range(slots):
        gid, kind = entries.get(index, (ZERO, None))
        (port / "gids" / str(index)).write_text(gid + "\n")
        if kind:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(netdev + "\n")


def spark_cage(root: Path, twin0: dict | None = None, twin1: dict | None = None, **kwargs) -> str:
    """Cage 1 of a Spark: the address twin (link-local and IPv4 GIDs), the other only link-local."""
    rdma_port(root, "rocep1s0f1", "ring1", twin0 if twin0 is not None else {**LINK_LOCAL, **IPV4}, **kwargs)
    rdma_port(root, "roceP2p1s0f1", "ring1b", twin1 if twin1 is not None else LINK_LOCAL, **kwargs)
    return str(root)


def link(link_facts, iface: str, **kwargs):
    values = {"exists": True, "operstate": "up", "carrier": True, "mtu": 9000, "speed_mbps": 200000} | kwargs
    return link_facts.Link(iface, **values)


def facts(checks, link_facts, twin: int, sysfs: str, addresses: list[str] | None = None, **link_kwargs):
    """A twin's facts: the link and addresses given here, RDMA read from `sysfs` as read_twin does."""
    iface = PORT["twins"][twin]["interface"]
    addresses = ([PORT["address"] + "/24"] if twin == 0 else []) if addresses is None else addresses

    def run(argv):
        return 0, "", ""

    got = checks.read_twin(PORT, twin, "verbs", run, "ip", sysfs)
    got.link = link(link_facts, iface, **link_kwargs)
    got.addresses = [ipaddress.IPv4Interface(a) for a in addresses]
    return got


def by_id(found):
    return {check.id: check for check in found}


@pytest.mark.parametrize("prefix", ["PF", "CQ"])
def test_a_healthy_spark_cage_passes_every_check_of_both_twins(checks, link_facts, tmp_path, prefix):
    sysfs = spark_cage(tmp_path)
    for twin in (0, 1):
        found = checks.twin_checks(
            prefix,
            1,
            PORT,
            twin,
            facts(checks, link_facts, twin, sysfs),
            fabric="verbs",
            mtu=9000,
            speed_mbps=200000,
        )
        assert [c.id for c in found] == [
            f"{prefix}-{name}"
            for name in (
                "LINK-UP",
                "LINK-SPEED",
                "LINK-MTU",
                "LINK-ADDR",
                "RDMA-BIND",
                "RDMA-PORT",
                "RDMA-GID",
            )
        ]
        assert {c.status for c in found} == {"pass"}, [c for c in found if c.status != "pass"]
        interface = PORT["twins"][twin]["interface"]
        assert {c.subject for c in found} == {f"{EDGE} ({interface})"}
    gid = by_id(checks.rdma_checks(prefix, 1, PORT, 1, "verbs", facts(checks, link_facts, 1, sysfs)))
    assert "GID index 1 (auto) = fe80::5054:ff:fe53:5201" in gid[f"{prefix}-RDMA-GID"].detail


def test_each_rule_fails_naming_the_twin_with_a_fix(checks, link_facts):
    mtu = by_id(checks.link_checks("PF", 1, PORT, 1, link(link_facts, "ring1b", mtu=1500), 9000, None))
    assert mtu["PF-LINK-MTU"].status == "fail" and mtu["PF-LINK-MTU"].subject == f"{EDGE} (ring1b)"
    assert mtu["PF-LINK-MTU"].detail == "ring1b MTU 1500, expected 9000" and mtu["PF-LINK-MTU"].fix
    assert mtu["PF-LINK-SPEED"].status == "skip"
    down = by_id(
        checks.link_checks(
            "CQ", 1, PORT, 0, link(link_facts, "ring1", operstate="down", carrier=False), 9000, 200000
        )
    )
    assert down["CQ-LINK-UP"].status == "fail" and down["CQ-LINK-UP"].domain == "link"
    assert down["CQ-LINK-MTU"].status == "pass"
    gone = checks.link_checks("PF", 1, PORT, 1, link_facts.Link("ring1b", False), 9000, 200000)
    assert [(c.id, c.status) for c in gone] == [
        ("PF-LINK-UP", "fail"),
        ("PF-LINK-SPEED", "skip"),
        ("PF-LINK-MTU", "skip"),
    ]
    assert "twin interfaces of ranks[1].ring_ports cage 1" in gone[0].fix


@pytest.mark.parametrize(
    ("speed", "wanted", "status"),
    [
        (200000, 200000, "pass"),
        (100000, 200000, "fail"),
        (400000, 200000, "fail"),
        (None, 200000, "skip"),
        (10000, None, "skip"),
    ],
)
def test_link_speed_is_exactly_the_inventory_s(checks, link_facts, speed, wanted, status):
    found = by_id(
        checks.link_checks("CQ", 1, PORT, 0, link(link_facts, "ring1", speed_mbps=speed), 9000, wanted)
    )
    assert found["CQ-LINK-SPEED"].status == status


@pytest.mark.parametrize(
    ("twin", "configured", "status"),
    [
        (0, ["198.19.1.1/24"], "pass"),
        (0, ["198.19.1.99/24"], "fail"),  # wrong address
        (0, ["198.19.1.1/16"], "fail"),  # wrong prefix
        (0, ["198.19.1.1/24", "10.0.0.1/8"], "fail"),  # a stray extra address
        (0, [], "fail"),
        (1, [], "pass"),  # the second twin carries no address
        (1, ["198.19.1.3/24"], "fail"),  # a second address of the cable on this node
    ],
)
def test_address_twin_has_exactly_the_address_the_other_none(
    checks, link_facts, tmp_path, twin, configured, status
):
    found = checks.address_check(
        "PF", 1, PORT, twin, facts(checks, link_facts, twin, spark_cage(tmp_path), configured)
    )
    assert (found.id, found.status, found.domain) == ("PF-LINK-ADDR", status, "addressing")
    if status == "fail":
        expected = "exactly 198.19.1.1/24" if twin == 0 else "none"
        assert f"expected {expected}" in found.detail and found.fix


def test_jumbo_ping_from_the_address_twin(checks, link_facts):
    ok = checks.jumbo_check("CQ", 1, PORT, 9000, link_facts.PingResult(2, 2, None))
    assert ok.status == "pass" and "8972 B from ring1 to 198.19.1.2" in ok.detail
    lost = checks.jumbo_check(
        "PF", 1, PORT, 9000, link_facts.PingResult(2, 0, "local error: message too long, mtu=1500")
    )
    assert (lost.status, lost.domain, lost.subject) == ("fail", "path", f"{EDGE} (ring1)")
    assert "message too long" in lost.detail and lost.fix
    assert checks.jumbo_check("PF", 1, PORT, 9000, None).status == "skip"


def test_rdma_skips_on_tcp_and_fails_without_the_device(checks, link_facts, tmp_path):
    tcp = checks.rdma_checks("PF", 1, PORT, 0, "tcp", checks.TwinFacts(link(link_facts, "ring1")))
    assert {(c.status, c.detail) for c in tcp} == {("skip", "fabric tcp: no RDMA device")}
    absent = by_id(checks.rdma_checks("CQ", 1, PORT, 1, "verbs", facts(checks, link_facts, 1, str(tmp_path))))
    assert (
        absent["CQ-RDMA-BIND"].status == "fail"
        and "roceP2p1s0f1 port 1 does not exist" in absent["CQ-RDMA-BIND"].detail
    )
    assert absent["CQ-RDMA-PORT"].status == absent["CQ-RDMA-GID"].status == "skip"


def test_inactive_port_and_a_device_bound_elsewhere_fail(checks, link_facts, tmp_path):
    sysfs = spark_cage(tmp_path, state="1: DOWN")
    found = by_id(checks.rdma_checks("PF", 1, PORT, 0, "verbs", facts(checks, link_facts, 0, sysfs)))
    assert found["PF-RDMA-PORT"].status == "fail" and "DOWN" in found["PF-RDMA-PORT"].detail
    swapped = dict(PORT, twins=[dict(PORT["twins"][0], rdma_device="roceP2p1s0f1"), PORT["twins"][1]])
    got = checks.read_twin(swapped, 0, "verbs", lambda argv: (0, "", ""), "ip", sysfs)
    bind = by_id(checks.rdma_checks("PF", 1, swapped, 0, "verbs", got))["PF-RDMA-BIND"]
    assert bind.status == "fail" and "bound to ['ring1b']; expected ring1" in bind.detail


@pytest.mark.parametrize(
    ("twin", "entries", "gid_index", "expect"),
    [
        (0, {**LINK_LOCAL, 3: ("0000:0000:0000:0000:0000:ffff:c613:0199", "RoCE v2")}, 3, "expected ::ffff:c613:101"),
        (0, {**LINK_LOCAL, **IPV4}, 2, "type IB/RoCE v1"),
        (0, {**LINK_LOCAL, 2: IPV4[2]}, "auto", "no RoCE v2 entry"),
        (0, {**LINK_LOCAL, **IPV4}, 5, "index 5 is empty"),
        (0, {**LINK_LOCAL, **IPV4}, 8, "gid_index 8 is past the end of its GID table (gid_tbl_len 8): expected 0-7 or auto"),
        (1, {0: LINK_LOCAL[0]}, "auto", "no RoCE v2 entry"),
        (1, {**LINK_LOCAL, **IPV4}, 3, "GID ::ffff:c613:101 (expected a link-local fe80::/64 GID)"),
    ],
)  # fmt: skip
def test_gid_mismatches_fail_in_domain_rdma(checks, link_facts, tmp_path, twin, entries, gid_index, expect):
    sysfs = spark_cage(tmp_path, **({"twin0": entries} if twin == 0 else {"twin1": entries}))
    port = dict(PORT, twins=[dict(t) for t in PORT["twins"]])
    port["twins"][twin]["gid_index"] = gid_index
    got = checks.read_twin(port, twin, "verbs", lambda argv: (0, "", ""), "ip", sysfs)
    gid = by_id(checks.rdma_checks("CQ", 1, port, twin, "verbs", got))["CQ-RDMA-GID"]
    assert (gid.status, gid.domain) == ("fail", "rdma") and gid.fix
    assert expect in gid.detail


def test_fixed_indexes_pass_as_auto_does(checks, link_facts, tmp_path):
    sysfs = spark_cage(tmp_path)
    port = dict(PORT, twins=[dict(PORT["twins"][0], gid_index=3), dict(PORT["twins"][1], gid_index=1)])
    for twin, index in ((0, 3), (1, 1)):
        got = checks.read_twin(port, twin, "verbs", lambda argv: (0, "", ""), "ip", sysfs)
        gid = by_id(checks.rdma_checks("PF", 1, port, twin, "verbs", got))["PF-RDMA-GID"]
        assert gid.status == "pass" and f"GID index {index} =" in gid.detail


def test_argument_problems_name_the_twin_and_the_fix(checks):
    assert checks.port_argument_problems(PORT, "verbs") == []
    bare = dict(
        PORT, twins=[dict(PORT["twins"][0], gid_index="three"), dict(PORT["twins"][1], rdma_device=None)]
    )
    assert checks.port_argument_problems(bare, "verbs") == [
        "port cage 1.twins[0].gid_index: 'three' is neither a number nor 'auto'",
        "port cage 1.twins[1] (ring1b): fabric verbs needs rdma_device and rdma_port; add rdma to the twin in cluster.yml",
    ]
    assert checks.port_argument_problems(dict(PORT, peer_address="r2"), "tcp") == [
        "port cage 1.peer_address: 'r2' is not an IPv4 address; fix cluster.yml"
    ]


def test_verdict_names_the_most_basic_failed_domain(checks):
    found = [
        checks.Check("CQ-RDMA-GID", "fail", "rdma", EDGE, "no GID", "fix the GID"),
        checks.Check("CQ-LINK-MTU", "fail", "mtu", EDGE, "MTU 1500", "set MTU 9000"),
        checks.Check("CQ-PERF", "warn", "performance", EDGE, "slow"),
    ]
    got = checks.verdict(found)
    assert (got["status"], got["failure_domain"], got["fix"]) == ("failed", "mtu", "set MTU 9000")
    assert got["reasons"] == ["CQ-LINK-MTU: MTU 1500", "CQ-RDMA-GID: no GID", "CQ-PERF: slow"]
    assert checks.verdict(found[2:])["status"] == "qualified_with_warning"


def test_nccl_auto_gid_follows_ncclIbGetGidIndex(link_facts, tmp_path):
    """NCCL's own choice with NCCL_IB_GID_INDEX unset: the IPv4 RoCE v2 GID on the address twin,
    index 0 (link-local, RoCE v1 on mlx5) on the twin without an address."""
    sysfs = spark_cage(tmp_path)
    address_twin = link_facts.nccl_auto_gid("rocep1s0f1", 1, sysfs)
    assert (address_twin.index, str(address_twin.gid), address_twin.type) == (
        3,
        "::ffff:c613:101",
        "RoCE v2",
    )
    other = link_facts.nccl_auto_gid("roceP2p1s0f1", 1, sysfs)
    assert (other.index, other.type) == (0, "IB/RoCE v1")
    # The first RoCE v2 IPv4 GID wins over a later one; a v1-only table keeps the first IPv4 entry.
    rdma_port(
        tmp_path,
        "mlx5_9",
        "eth9",
        {**LINK_LOCAL, 2: IPV4[2], 4: IPV4[3], 5: ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")},
    )
    assert link_facts.nccl_auto_gid("mlx5_9", 1, str(tmp_path)).index == 4
    rdma_port(tmp_path, "mlx5_8", "eth8", {**LINK_LOCAL, 2: IPV4[2]})
    assert link_facts.nccl_auto_gid("mlx5_8", 1, str(tmp_path)).index == 2
