"""module_utils/sparkring_link_facts: parsers on captured tool output, sysfs readers on real and built trees."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

# Captured on this machine (iproute2 6.1, iputils 20221126) from the pf- namespaces.
IP_ADDR_RING0 = (
    '[{"ifindex":2,"ifname":"ring0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"mtu":9000,'
    '"operstate":"UP","addr_info":[{"family":"inet","local":"198.19.0.1","prefixlen":24,"scope":"global"},'
    '{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]},'
    '{"ifindex":3,"ifname":"ring1","addr_info":[]}]'
)
PING_OK = (
    "PING 198.19.0.2 (198.19.0.2) from 198.19.0.1 ring0: 8972(9000) bytes of data.\n"
    "8980 bytes from 198.19.0.2: icmp_seq=1 ttl=64 time=0.101 ms\n"
    "8980 bytes from 198.19.0.2: icmp_seq=2 ttl=64 time=0.060 ms\n\n"
    "--- 198.19.0.2 ping statistics ---\n"
    "2 packets transmitted, 2 received, 0% packet loss, time 201ms\n"
)
PING_TOO_LONG_OUT = (
    "PING 198.19.0.1 (198.19.0.1) from 198.19.0.2 ring0: 8972(9000) bytes of data.\n\n"
    "--- 198.19.0.1 ping statistics ---\n"
    "1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms\n"
)
PING_TOO_LONG_ERR = "ping: local error: message too long, mtu=1500\n"
PING_HOST_UNREACHABLE = (
    "PING 198.19.1.2 (198.19.1.2) from 198.19.0.1 ring0: 56(84) bytes of data.\n"
    "From 198.19.0.1 icmp_seq=1 Destination Host Unreachable\n\n"
    "--- 198.19.1.2 ping statistics ---\n"
    "1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms\n"
)


def test_ipv4_addresses_keep_inet_only(link_facts):
    parsed = link_facts.parse_ipv4_addresses(IP_ADDR_RING0)
    assert parsed == {"ring0": [ipaddress.IPv4Interface("198.19.0.1/24")], "ring1": []}


def test_ipv4_addresses_reject_garbage(link_facts):
    with pytest.raises(link_facts.LinkFactError, match="invalid JSON"):
        link_facts.parse_ipv4_addresses("Device does not exist")


def test_ipv4_addresses_of_loopback_via_real_ip(link_facts):
    """The real `ip` binary here: lo carries 127.0.0.1/8."""
    import subprocess

    def run(argv):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    assert ipaddress.IPv4Interface("127.0.0.1/8") in link_facts.ipv4_addresses(run, "lo")
    with pytest.raises(link_facts.LinkFactError, match="does not exist"):
        link_facts.ipv4_addresses(run, "pf-no-such0")


def test_route_get(link_facts):
    route = link_facts.parse_route_get(
        '[{"dst":"198.19.0.2","dev":"ring0","prefsrc":"198.19.0.1","flags":[],"uid":0,"cache":[]}]'
    )
    assert route == link_facts.Route(destination="198.19.0.2", dev="ring0", gateway=None, type="unicast")
    assert link_facts.parse_route_get("[]") is None


@pytest.mark.parametrize(
    ("rc", "out", "err", "received", "error"),
    [
        (0, PING_OK, "", 2, None),
        (1, PING_TOO_LONG_OUT, PING_TOO_LONG_ERR, 0, "local error: message too long, mtu=1500"),
        (1, PING_HOST_UNREACHABLE, "", 0, "From 198.19.0.1 icmp_seq=1 Destination Host Unreachable"),
        (2, "", "ping: connect: Network is unreachable\n", 0, "connect: Network is unreachable"),
        (
            2,
            "",
            "/usr/bin/ping: SO_BINDTODEVICE ring9: No such device\n",
            0,
            "SO_BINDTODEVICE ring9: No such device",
        ),
        (
            1,
            PING_OK.replace("2 received", "0 received"),
            "ping: Warning: source address might be selected\n",
            0,
            "no reply (ping exit 1)",
        ),
        (1, PING_TOO_LONG_OUT.replace(", +1 errors", ""), "", 0, "no reply (ping exit 1)"),
    ],
)
def test_parse_ping(link_facts, rc, out, err, received, error):
    result = link_facts.parse_ping(rc, out, err)
    assert (result.received, result.error, result.answered) == (received, error, received > 0)


def test_ping_builds_a_bound_df_probe(link_facts):
    seen = []

    def run(argv):
        seen.append(argv)
        return 0, PING_OK, ""

    result = link_facts.ping(
        run, "198.19.0.2", interface="ring0", payload_bytes=8972, dont_fragment=True, count=2, timeout_s=2
    )
    assert result.answered
    assert [" ".join(argv) for argv in seen] == ["ping -n -c 2 -W 2 -I ring0 -i 0.2 -s 8972 -M do 198.19.0.2"]


def test_ping_refuses_what_is_not_an_address_or_device(link_facts):
    with pytest.raises(ValueError):
        link_facts.ping(lambda argv: (0, "", ""), "198.19.0.2; reboot", interface="ring0")
    with pytest.raises(ValueError):
        link_facts.ping(lambda argv: (0, "", ""), "198.19.0.2", interface="../ring0")


def test_jumbo_payload(link_facts):
    assert link_facts.jumbo_payload(9000) == 8972
    assert link_facts.jumbo_payload(1500) == 1472


def test_read_link_on_real_loopback(link_facts):
    link = link_facts.read_link("lo")
    assert link.exists and link.mtu == 65536 and link.operstate == "unknown"


def _net(tmp_path: Path, name: str, **attrs: str) -> str:
    base = tmp_path / "class" / "net" / name
    base.mkdir(parents=True)
    for key, value in attrs.items():
        (base / key).write_text(value + "\n")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("attrs", "up", "mtu", "speed"),
    [
        ({"operstate": "up", "carrier": "1", "mtu": "9000", "speed": "200000"}, True, 9000, 200000),
        # A down link: the kernel refuses carrier and speed (EINVAL), which reads as missing.
        ({"operstate": "down", "mtu": "9000"}, False, 9000, None),
        ({"operstate": "lowerlayerdown", "carrier": "0", "mtu": "1500", "speed": "-1"}, False, 1500, None),
    ],
)
def test_read_link_from_sysfs(link_facts, tmp_path, attrs, up, mtu, speed):
    link = link_facts.read_link("ring0", _net(tmp_path, "ring0", **attrs))
    assert (link.exists, link.up, link.mtu, link.speed_mbps) == (True, up, mtu, speed)


def test_read_link_missing_and_unsafe(link_facts, tmp_path):
    assert link_facts.read_link("ring9", str(tmp_path)) == link_facts.Link(interface="ring9", exists=False)
    with pytest.raises(ValueError):
        link_facts.read_link("..", str(tmp_path))


def _rdma(
    tmp_path: Path, gids: dict[int, tuple[str, str | None, str | None]], state: str = "4: ACTIVE"
) -> str:
    """A /sys/class/infiniband tree for rocep1s0f0 port 1 with the given GID entries."""
    port = tmp_path / "class" / "infiniband" / "rocep1s0f0" / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    for index in range(8):
        gid, kind, ndev = gids.get(index, ("0000:0000:0000:0000:0000:0000:0000:0000", None, None))
        (port / "gids" / str(index)).write_text(gid + "\n")
        if kind is not None:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")
    return str(tmp_path)


# The GID table a ConnectX port shows for 198.19.0.1: link-local v1/v2, then IPv4-mapped v1/v2.
SPARK_GIDS = {
    0: ("fe80:0000:0000:0000:0a5c:2eff:fe11:2233", "IB/RoCE v1", "enp1s0f0np0"),
    1: ("fe80:0000:0000:0000:0a5c:2eff:fe11:2233", "RoCE v2", "enp1s0f0np0"),
    2: ("0000:0000:0000:0000:0000:ffff:c613:0001", "IB/RoCE v1", "enp1s0f0np0"),
    3: ("0000:0000:0000:0000:0000:ffff:c613:0001", "RoCE v2", "enp1s0f0np0"),
}


def test_ipv4_mapped_gid(link_facts):
    assert link_facts.ipv4_mapped_gid("198.19.0.1") == ipaddress.IPv6Address("::ffff:c613:1")


def test_gid_table_and_auto_resolution(link_facts, tmp_path):
    sysfs = _rdma(tmp_path, SPARK_GIDS)
    assert [gid.index for gid in link_facts.read_gids("rocep1s0f0", 1, sysfs)] == [0, 1, 2, 3]
    assert link_facts.read_gid("rocep1s0f0", 1, 5, sysfs) is None  # empty entry
    found = link_facts.find_roce_v2_gid("rocep1s0f0", 1, "198.19.0.1", sysfs)
    assert (found.index, found.type, found.netdev) == (3, "RoCE v2", "enp1s0f0np0")
    assert link_facts.find_roce_v2_gid("rocep1s0f0", 1, "198.19.0.9", sysfs) is None
    assert link_facts.gid_table_length("rocep1s0f0", 1, sysfs) == 8  # empty entries count too
    assert link_facts.gid_table_length("rocep1s0f0", 2, sysfs) is None


def test_rdma_port_state(link_facts, tmp_path):
    sysfs = _rdma(tmp_path, SPARK_GIDS, state="1: DOWN")
    port = link_facts.read_rdma_port("rocep1s0f0", 1, sysfs)
    assert (port.exists, port.active, port.state, port.phys_state) == (True, False, "DOWN", "LinkUp")
    assert not link_facts.read_rdma_port("rocep1s0f0", 2, sysfs).exists
    assert link_facts.rdma_devices(sysfs) == ["rocep1s0f0"]
    assert link_facts.rdma_devices(str(tmp_path / "none")) == []
