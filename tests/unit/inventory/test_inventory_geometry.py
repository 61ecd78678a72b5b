"""The hostvars derived from the ring geometry, on pairs and rings of 4, 6, 8 and 10."""

from __future__ import annotations

import pytest
from inventory_builders import load_inventory, sim_ring
from sparkring.cluster import validate_cluster
from sparkring.hostvars import cluster_groups, cluster_hostvars

RING_SIZES = (4, 6, 8, 10)


@pytest.mark.parametrize("n", RING_SIZES)
def test_ring_hostvars_neighbours_ports_and_rounds(n: int) -> None:
    hostvars = cluster_hostvars(validate_cluster(sim_ring(n)))
    assert list(hostvars) == [f"r{r}" for r in range(n)]
    for r in range(n):
        v = hostvars[f"r{r}"]
        assert (v["sparkring_rank"], v["sparkring_world_size"]) == (r, n)
        assert v["sparkring_left"] == {"rank": (r - 1) % n, "host": f"r{(r - 1) % n}"}
        assert v["sparkring_right"] == {"rank": (r + 1) % n, "host": f"r{(r + 1) % n}"}
        assert [p["cage"] for p in v["sparkring_ports"]] == [0, 1]
        for port in v["sparkring_ports"]:
            peer = hostvars[port["peer_host"]]
            (back,) = [p for p in peer["sparkring_ports"] if p["edge"] == port["edge"]]
            assert (back["peer_rank"], back["peer_address"]) == (r, port["address"])
            assert (port["peer_cage"], port["peer_interface"]) == (back["cage"], back["interface"])
        rounds = v["sparkring_rounds"]
        other = (r - 1) % n if r % 2 == 0 else (r + 1) % n
        assert [(x["round"], x["peer_rank"], x["cage"]) for x in rounds] == [(0, r ^ 1, 0), (1, other, 1)]
        assert [x["interface"] for x in rounds] == ["ring0", "ring1"]


def test_six_rank_ring_by_hand() -> None:
    hostvars = cluster_hostvars(validate_cluster(sim_ring(6)))
    r5 = hostvars["r5"]
    assert (r5["sparkring_left"]["rank"], r5["sparkring_right"]["rank"]) == (4, 0)
    assert [(x["peer_rank"], x["peer_address"]) for x in r5["sparkring_rounds"]] == [
        (4, "198.19.4.1"),
        (0, "198.19.5.2"),
    ]
    assert [(x["peer_rank"], x["peer_address"]) for x in hostvars["r2"]["sparkring_rounds"]] == [
        (3, "198.19.2.2"),
        (1, "198.19.1.1"),
    ]


def test_pair_hostvars_have_one_port_one_round_and_the_peer_on_both_sides() -> None:
    hostvars = cluster_hostvars(validate_cluster(load_inventory("pair")))
    for rank, peer in ((0, 1), (1, 0)):
        v = hostvars[f"spark{rank}"]
        assert v["sparkring_left"] == v["sparkring_right"] == {"rank": peer, "host": f"spark{peer}"}
        (port,) = v["sparkring_ports"]
        (round0,) = v["sparkring_rounds"]
        assert (round0["round"], round0["peer_rank"], round0["peer_address"]) == (
            0,
            peer,
            port["peer_address"],
        )
        # The cage's two twins: the first carries the address, both their RDMA devices.
        assert [(t["interface"], t["address"], t["rdma_device"], t["rdma_port"]) for t in port["twins"]] == [
            ("enp1s0f0np0", port["address"], "rocep1s0f0", 1),
            ("enP2p1s0f0np0", None, "roceP2p1s0f0", 1),
        ]
        assert port["interface"] == "enp1s0f0np0"


def test_groups_head_is_rank_zero() -> None:
    groups = cluster_groups(validate_cluster(sim_ring(6)))
    assert groups == {
        "sparkring": [f"r{r}" for r in range(6)],
        "sparkring_head": ["r0"],
        "sparkring_workers": [f"r{r}" for r in range(1, 6)],
    }


def test_tcp_fabric_publishes_no_rdma_even_when_blocks_are_present() -> None:
    data = load_inventory("ring4")
    data["cluster"]["fabric"] = "tcp"
    for v in cluster_hostvars(validate_cluster(data)).values():
        for port in v["sparkring_ports"]:
            for twin in port["twins"]:
                assert (twin["rdma_device"], twin["rdma_port"], twin["gid_index"]) == (None, None, None)


def test_ssh_override_and_defaults() -> None:
    hostvars = cluster_hostvars(validate_cluster(load_inventory("ring4")))
    assert (hostvars["spark0"]["ansible_host"], hostvars["spark0"]["ansible_port"]) == ("192.0.2.10", 22)
    assert (hostvars["spark3"]["ansible_host"], hostvars["spark3"]["ansible_port"]) == (
        "spark-3.mgmt.example.net",
        2222,
    )
    assert "ansible_ssh_common_args" not in hostvars["spark0"]
    sim = cluster_hostvars(validate_cluster(load_inventory("sim")))["r1"]
    assert sim["ansible_ssh_common_args"] == (
        '-o ProxyCommand="ip netns exec sr-ctl nc %h %p" '
        "-o UserKnownHostsFile=/var/lib/sparkring-sim/ssh/known_hosts"
    )


def test_sim_inventory_follows_the_sim_geometry() -> None:
    assert load_inventory("sim") == sim_ring(4)
