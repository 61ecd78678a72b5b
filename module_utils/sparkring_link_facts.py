"""Link facts of a ring port, read on the node: one function per fact.

Preflight and cable qualification both judge the ring links, so each fact (carrier, MTU,
negotiated speed, the port's IPv4 addresses, the route to an address, whether a
don't-fragment ping gets through, the RoCE GID table) is measured here, one way, and
both modules share it. Commands run through a caller-supplied `Runner` so that this file
needs no AnsibleModule and stays standard library only: it ships to the nodes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

# (argv) -> (rc, stdout, stderr); AnsibleModule.run_command fits after a lambda.
Runner = Callable[[list[str]], tuple[int, str, str]]

SYSFS = "/sys"
# IPv4 header (20 B) + ICMP echo header (8 B): the largest DF payload that fits an MTU.
IPV4_ICMP_OVERHEAD = 28
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")
# iputils prefixes its messages with argv[0] ("ping: " or "/usr/bin/ping: ").
_PING_PREFIX = re.compile(r"^\S*ping: ")


class LinkFactError(Exception):
    """A fact could not be read (a tool failed or printed something unexpected)."""


def _safe_name(name: str) -> str:
    """Interface and RDMA device names become sysfs path components: refuse traversal."""
    if not name or "/" in name or name in {".", ".."} or "\0" in name:
        raise ValueError(f"invalid device name {name!r}")
    return name


def _read_sysfs(path: str) -> str | None:
    """Read one sysfs attribute; None where the kernel refuses (EINVAL on a down link)."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Link:
    """What the kernel says about one network interface."""

    interface: str
    exists: bool
    operstate: str | None = None
    carrier: bool | None = None
    mtu: int | None = None
    speed_mbps: int | None = None

    @property
    def up(self) -> bool:
        # Some drivers report operstate "unknown" while passing traffic; carrier decides.
        return self.exists and self.operstate in {"up", "unknown"} and self.carrier is True


def read_link(interface: str, sysfs: str = SYSFS) -> Link:
    """Carrier, operational state, MTU and negotiated speed from /sys/class/net.

    The speed is the value ethtool prints (the kernel's link settings); it is unreadable
    or -1 while the link is down, which reads as None.
    """
    base = os.path.join(sysfs, "class", "net", _safe_name(interface))
    if not os.path.isdir(base):
        return Link(interface=interface, exists=False)
    carrier = _read_sysfs(os.path.join(base, "carrier"))
    speed = _int_or_none(_read_sysfs(os.path.join(base, "speed")))
    return Link(
        interface=interface,
        exists=True,
        operstate=_read_sysfs(os.path.join(base, "operstate")),
        carrier=None if carrier is None else carrier == "1",
        mtu=_int_or_none(_read_sysfs(os.path.join(base, "mtu"))),
        speed_mbps=speed if speed is not None and speed > 0 else None,
    )


def parse_ipv4_addresses(ip_json: str) -> dict[str, list[ipaddress.IPv4Interface]]:
    """Map interface name -> IPv4 address/prefix from `ip -j addr show` output."""
    try:
        links = json.loads(ip_json or "[]")
    except json.JSONDecodeError as exc:
        raise LinkFactError(f"`ip -j addr` printed invalid JSON: {exc}") from exc
    result: dict[str, list[ipaddress.IPv4Interface]] = {}
    for link in links:
        name = link.get("ifname")
        if not name:
            continue
        result[name] = [
            ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}")
            for info in link.get("addr_info", [])
            if info.get("family") == "inet"
        ]
    return result


def ipv4_addresses(run: Runner, interface: str, ip: str = "ip") -> list[ipaddress.IPv4Interface]:
    """The IPv4 addresses (with prefix) configured on one interface."""
    rc, out, err = run([ip, "-j", "-4", "addr", "show", "dev", _safe_name(interface)])
    if rc != 0:
        raise LinkFactError(f"`ip addr show dev {interface}` failed: {(err or out).strip()}")
    return parse_ipv4_addresses(out).get(interface, [])


@dataclass(frozen=True)
class Route:
    """The kernel's answer to `ip route get`: which device (and gateway) would carry it."""

    destination: str
    dev: str | None
    gateway: str | None
    type: str


def parse_route_get(ip_json: str) -> Route | None:
    """Parse `ip -j route get` output; None when it holds no route."""
    try:
        routes = json.loads(ip_json or "[]")
    except json.JSONDecodeError as exc:
        raise LinkFactError(f"`ip -j route get` printed invalid JSON: {exc}") from exc
    if not routes:
        return None
    first = routes[0]
    return Route(
        destination=first.get("dst", ""),
        dev=first.get("dev"),
        gateway=first.get("gateway"),
        type=first.get("type", "unicast"),
    )


def route_to(run: Runner, address: str, ip: str = "ip") -> Route | None:
    """The route the kernel would use to `address`; None when it has none (unreachable)."""
    rc, out, _err = run([ip, "-j", "route", "get", str(ipaddress.IPv4Address(address))])
    return parse_route_get(out) if rc == 0 else None


@dataclass(frozen=True)
class PingResult:
    """Outcome of one ping run: counts and, when nothing came back, why."""

    transmitted: int
    received: int
    error: str | None

    @property
    def answered(self) -> bool:
        return self.received > 0


def parse_ping(rc: int, out: str, err: str) -> PingResult:
    """Read iputils ping output: the summary counts and the first reason for a loss.

    The reason is the local error ("message too long, mtu=1500", "Network is
    unreachable") from stderr, else an ICMP error line ("From ... Destination Host
    Unreachable") from stdout.
    """
    match = _PING_SUMMARY.search(out)
    transmitted, received = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    error = None
    if received == 0:
        lines = [_PING_PREFIX.sub("", line.strip()) for line in err.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("Warning")]
        icmp = [line for line in out.splitlines() if line.startswith("From ")]
        error = (lines or icmp or [f"no reply (ping exit {rc})"])[0]
    return PingResult(transmitted=transmitted, received=received, error=error)


def ping(
    run: Runner,
    address: str,
    *,
    interface: str,
    payload_bytes: int | None = None,
    dont_fragment: bool = False,
    count: int = 1,
    timeout_s: int = 1,
    ping_bin: str = "ping",
) -> PingResult:
    """Ping `address` out of `interface` only (SO_BINDTODEVICE: no other path counts)."""
    argv = [ping_bin, "-n", "-c", str(count), "-W", str(timeout_s), "-I", _safe_name(interface)]
    if count > 1:
        argv += ["-i", "0.2"]
    if payload_bytes is not None:
        argv += ["-s", str(payload_bytes)]
    if dont_fragment:
        argv += ["-M", "do"]
    argv.append(str(ipaddress.IPv4Address(address)))
    return parse_ping(*run(argv))


def jumbo_payload(mtu: int) -> int:
    """The ICMP payload that fills an MTU exactly (8972 for 9000)."""
    return mtu - IPV4_ICMP_OVERHEAD


def ipv4_mapped_gid(address: str) -> ipaddress.IPv6Address:
    """The RoCE v2 GID of an IPv4 port address (::ffff:a.b.c.d)."""
    return ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(address)}")


@dataclass(frozen=True)
class RdmaPort:
    """State of one RDMA device port from /sys/class/infiniband."""

    device: str
    port: int
    exists: bool
    state: str | None = None
    phys_state: str | None = None

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def _state_name(text: str | None) -> str | None:
    # sysfs writes "4: ACTIVE" and "5: LinkUp": keep the name.
    return text.split(":", 1)[-1].strip() if text else None


def _rdma_port_dir(device: str, port: int, sysfs: str) -> str:
    return os.path.join(sysfs, "class", "infiniband", _safe_name(device), "ports", str(int(port)))


def rdma_devices(sysfs: str = SYSFS) -> list[str]:
    """Names of the RDMA devices the kernel knows (empty without RDMA)."""
    try:
        return sorted(os.listdir(os.path.join(sysfs, "class", "infiniband")))
    except OSError:
        return []


def read_rdma_port(device: str, port: int, sysfs: str = SYSFS) -> RdmaPort:
    """Logical and physical state of an RDMA port."""
    base = _rdma_port_dir(device, port, sysfs)
    if not os.path.isdir(base):
        return RdmaPort(device=device, port=port, exists=False)
    return RdmaPort(
        device=device,
        port=port,
        exists=True,
        state=_state_name(_read_sysfs(os.path.join(base, "state"))),
        phys_state=_state_name(_read_sysfs(os.path.join(base, "phys_state"))),
    )


# PCIe transfer rate (GT/s) -> generation, as the kernel writes current_link_speed ("32.0 GT/s PCIe").
PCIE_GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_PCIE_RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def _pcie_rate(text: str | None) -> float | None:
    match = _PCIE_RATE.search(text or "")
    return float(match.group(1)) if match else None


@dataclass(frozen=True)
class PcieLink:
    """The PCIe link of an RDMA device's function: trained rate and width against what it can reach.

    The reachable maximum is the lesser of the function's own (max_link_*) and its upstream port's,
    as the kernel bounds a device's bandwidth by its link chain (pcie_print_link_status).
    """

    device: str
    address: str | None  # PCI bus address, e.g. 0000:01:00.0; None: not a PCI function (soft RoCE)
    speed_gt_s: float | None = None
    width: int | None = None
    max_speed_gt_s: float | None = None
    max_width: int | None = None
    firmware: str | None = None  # the NIC's fw_ver

    @property
    def at_maximum(self) -> bool:
        return (self.speed_gt_s, self.width) == (self.max_speed_gt_s, self.max_width)


def pcie_describe(speed_gt_s: float | None, width: int | None) -> str:
    """Gen5 x4 (32.0 GT/s x4), as a person reads lspci."""
    gen = PCIE_GENERATIONS.get(speed_gt_s) if speed_gt_s is not None else None
    return f"{f'Gen{gen}' if gen else '?'} x{width if width is not None else '?'} ({speed_gt_s} GT/s)"


def read_pcie_link(device: str, sysfs: str = SYSFS) -> PcieLink:
    """current_link_speed/width of an RDMA device's PCI function against max_link_* (and its upstream
    port's), from /sys/class/infiniband/<device>/device, and the NIC firmware (fw_ver)."""
    base = os.path.join(sysfs, "class", "infiniband", _safe_name(device))
    firmware = _read_sysfs(os.path.join(base, "fw_ver")) or None
    function = os.path.join(base, "device")
    if not os.path.isfile(os.path.join(function, "current_link_width")):
        return PcieLink(device=device, address=None, firmware=firmware)
    real = os.path.realpath(function)

    def attr(where: str, name: str) -> str | None:
        return _read_sysfs(os.path.join(where, name))

    max_speed, max_width = (
        _pcie_rate(attr(real, "max_link_speed")),
        _int_or_none(attr(real, "max_link_width")),
    )
    upstream = os.path.dirname(real)
    up_speed, up_width = (
        _pcie_rate(attr(upstream, "max_link_speed")),
        _int_or_none(attr(upstream, "max_link_width")),
    )
    if max_speed is not None and up_speed is not None:
        max_speed = min(max_speed, up_speed)
    if max_width is not None and up_width is not None:
        max_width = min(max_width, up_width)
    return PcieLink(
        device=device,
        address=os.path.basename(real),
        speed_gt_s=_pcie_rate(attr(real, "current_link_speed")),
        width=_int_or_none(attr(real, "current_link_width")),
        max_speed_gt_s=max_speed,
        max_width=max_width,
        firmware=firmware,
    )


# The board's firmware as DMI shows it (absent on nodes without DMI, such as some arm64 boards).
DMI_FIRMWARE = ("bios_vendor", "bios_version", "bios_date", "board_name", "product_name")


def read_board_firmware(sysfs: str = SYSFS) -> dict[str, str]:
    """The DMI fields of DMI_FIRMWARE this node exposes (an empty dict where it has no DMI)."""
    base = os.path.join(sysfs, "class", "dmi", "id")
    found = {name: _read_sysfs(os.path.join(base, name)) for name in DMI_FIRMWARE}
    return {name: value for name, value in found.items() if value}


@dataclass(frozen=True)
class Gid:
    """One populated entry of an RDMA port's GID table."""

    index: int
    gid: ipaddress.IPv6Address
    type: str | None
    netdev: str | None


def read_gid(device: str, port: int, index: int, sysfs: str = SYSFS) -> Gid | None:
    """The GID at `index`; None when the entry is empty or does not exist."""
    base = _rdma_port_dir(device, port, sysfs)
    raw = _read_sysfs(os.path.join(base, "gids", str(int(index))))
    if not raw:
        return None
    try:
        gid = ipaddress.IPv6Address(raw)
    except ValueError:
        return None
    if gid == ipaddress.IPv6Address(0):
        return None
    return Gid(
        index=int(index),
        gid=gid,
        type=_read_sysfs(os.path.join(base, "gid_attrs", "types", str(int(index)))),
        netdev=_read_sysfs(os.path.join(base, "gid_attrs", "ndevs", str(int(index)))),
    )


def read_gids(device: str, port: int, sysfs: str = SYSFS) -> list[Gid]:
    """Every populated GID of a port, by index."""
    try:
        names = os.listdir(os.path.join(_rdma_port_dir(device, port, sysfs), "gids"))
    except OSError:
        return []
    entries = (read_gid(device, port, int(name), sysfs) for name in names if name.isdigit())
    return sorted((gid for gid in entries if gid is not None), key=lambda gid: gid.index)


def gid_table_length(device: str, port: int, sysfs: str = SYSFS) -> int | None:
    """The port's gid_tbl_len: the kernel lists one gids/<index> entry per table slot, empty or not.

    None when the port shows no GID table here (no such device or port).
    """
    try:
        names = os.listdir(os.path.join(_rdma_port_dir(device, port, sysfs), "gids"))
    except OSError:
        return None
    return sum(name.isdigit() for name in names)


def find_roce_v2_gid(device: str, port: int, address: str, sysfs: str = SYSFS) -> Gid | None:
    """Resolve GID index "auto": the RoCE v2 entry equal to the port's IPv4-mapped address."""
    wanted = ipv4_mapped_gid(address)
    for gid in read_gids(device, port, sysfs):
        if gid.gid == wanted and gid.type == "RoCE v2":
            return gid
    return None


LINK_LOCAL = ipaddress.IPv6Network("fe80::/64")


def find_link_local_roce_v2_gid(device: str, port: int, sysfs: str = SYSFS) -> Gid | None:
    """Resolve GID index "auto" of a twin without an address: its first link-local RoCE v2 GID."""
    for gid in read_gids(device, port, sysfs):
        if gid.gid in LINK_LOCAL and gid.type == "RoCE v2":
            return gid
    return None


def nccl_auto_gid(device: str, port: int, sysfs: str = SYSFS) -> Gid | None:
    """The GID NCCL's NET/IB picks on a RoCE port when NCCL_IB_GID_INDEX is unset.

    ncclIbGetGidIndex (src/transport/net_ib/connect.cc, 2.29.7 and 2.30.7) with its defaults
    (NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_ROCE_VERSION_NUM=2, no NCCL_IB_ADDR_RANGE) starts at
    index 0 and walks the table: an IPv4-mapped GID replaces one of the other family, and a
    routable (not link-local) IPv4 GID of RoCE v2 replaces one of another version. On a port
    without an IPv4 address nothing replaces index 0: NCCL uses it as it stands.
    """
    table = {gid.index: gid for gid in read_gids(device, port, sysfs)}
    length = gid_table_length(device, port, sysfs) or 0

    def v4(gid: Gid | None) -> bool:
        return gid is not None and gid.gid.ipv4_mapped is not None

    def routable(gid: Gid | None) -> bool:
        return gid is not None and gid.gid not in LINK_LOCAL

    def replaces(current: Gid | None, candidate: Gid | None) -> bool:
        if candidate is None or not v4(candidate):
            return False
        if not v4(current):
            return True  # the user's family over another
        improves = current is None or current.type != "RoCE v2" or not routable(current)
        return routable(candidate) and candidate.type == "RoCE v2" and improves

    chosen = 0
    for index in range(1, length):
        if replaces(table.get(chosen), table.get(index)):
            chosen = index
    return table.get(chosen)


# ---- added for cable qualification (library/sparkring_cable.py) ----

# Error counters compared before and after the traffic of a qualification: CRC and frame
# errors point at the cable or transceiver, drops at a queue or MTU, carrier changes at a
# flapping link. Keys are /sys/class/net/<if>/statistics/ file names (plus carrier_changes).
ERROR_COUNTERS = (
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "carrier_changes",
)


def read_counters(interface: str, sysfs: str = SYSFS) -> dict[str, int | None]:
    """The error counters of one interface; None where the driver does not keep one."""
    base = os.path.join(sysfs, "class", "net", _safe_name(interface))
    out: dict[str, int | None] = {}
    for name in ERROR_COUNTERS:
        where = base if name == "carrier_changes" else os.path.join(base, "statistics")
        out[name] = _int_or_none(_read_sysfs(os.path.join(where, name)))
    return out


def rdma_netdevs(device: str, port: int, sysfs: str = SYSFS) -> set[str]:
    """The network interfaces an RDMA port is bound to (the netdevs of its GID entries).

    RoCE populates a port's GIDs from the addresses of the netdev it sits on, so the GID
    table names the binding on every driver (mlx5 and rxe alike).
    """
    return {gid.netdev for gid in read_gids(device, port, sysfs) if gid.netdev}


# Link-layer beacons: who is at the other end of a cable, whatever its IP configuration.
# Ethertype 0x88B5 is IEEE 802's "local experimental" type; frames go to the broadcast
# address, which on a point-to-point cable is exactly the one neighbour.
BEACON_ETHERTYPE = 0x88B5
BEACON_MAGIC = b"SRB1"
_PACKET_OUTGOING = 4


@dataclass(frozen=True)
class Beacon:
    """What a beacon exchange on one port saw: the neighbour's identity, or why not."""

    heard: dict | None
    peer_heard_us: bool
    error: str | None = None


def _beacon_frame(mac: bytes, identity: dict, heard: bool) -> bytes:
    payload = BEACON_MAGIC + json.dumps({**identity, "heard": heard}, sort_keys=True).encode()
    return b"\xff" * 6 + mac + BEACON_ETHERTYPE.to_bytes(2, "big") + payload


def _parse_beacon(frame: bytes) -> dict | None:
    payload = frame[14:]
    if not payload.startswith(BEACON_MAGIC):
        return None
    try:
        found = json.loads(payload[len(BEACON_MAGIC) :].rstrip(b"\0"))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _packet_socket(interface: str) -> tuple[socket.socket, bytes]:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(BEACON_ETHERTYPE))
    try:
        sock.bind((_safe_name(interface), BEACON_ETHERTYPE))
    except OSError:
        sock.close()
        raise
    return sock, sock.getsockname()[4][:6].ljust(6, b"\0")


def exchange_beacons(
    interface: str,
    identity: dict,
    timeout_s: float,
    announce: dict[str, dict] | None = None,
    interval_s: float = 0.1,
    linger: int = 5,
) -> Beacon:
    """Send this port's identity out of `interface` and listen there for the other end's.

    Both ends run this at the same time (the qualify stage runs every rank's module in
    the same task). Each keeps sending until it has heard the neighbour and the
    neighbour's beacon says it heard us, then sends `linger` more so the neighbour learns
    that too; every wait is bounded by `timeout_s`. `announce` maps the node's other ring
    interfaces to their identities: beacons go out there too (never listened to, errors
    ignored), so a cable plugged into the wrong cage still reaches a port that hears who
    it is. Needs CAP_NET_RAW (root).
    """
    heard: dict | None = None
    peer_heard_us = False
    others: list[tuple[socket.socket, bytes, dict]] = []
    try:
        sock, mac = _packet_socket(interface)
    except OSError as exc:
        return Beacon(None, False, f"cannot open a packet socket on {interface}: {exc} (needs root)")
    try:
        for other, other_identity in (announce or {}).items():
            with contextlib.suppress(OSError):
                others.append((*_packet_socket(other), other_identity))
        deadline = time.monotonic() + timeout_s
        next_send, left = 0.0, linger
        while time.monotonic() < deadline and left > 0:
            now = time.monotonic()
            if now >= next_send:
                try:
                    sock.send(_beacon_frame(mac, identity, heard is not None))
                except OSError as exc:
                    return Beacon(heard, peer_heard_us, f"cannot send on {interface}: {exc.strerror}")
                for other_sock, other_mac, other_identity in others:
                    with contextlib.suppress(OSError):
                        other_sock.send(_beacon_frame(other_mac, other_identity, False))
                next_send = now + interval_s
                if heard is not None and peer_heard_us:
                    left -= 1
            ready, _, _ = select.select([sock], [], [], max(0.0, min(next_send, deadline) - time.monotonic()))
            while ready:
                frame, address = sock.recvfrom(9216)
                found = None if address[2] == _PACKET_OUTGOING else _parse_beacon(frame)
                if found is not None and found.get("host") != identity.get("host"):
                    peer_heard_us = peer_heard_us or bool(found.pop("heard", False))
                    heard = found
                ready, _, _ = select.select([sock], [], [], 0)
    except OSError as exc:
        return Beacon(heard, peer_heard_us, f"beacon exchange on {interface} failed: {exc}")
    finally:
        sock.close()
        for other_sock, _mac, _identity in others:
            other_sock.close()
    return Beacon(heard, peer_heard_us, None if heard else f"nothing heard within {timeout_s:g} s")
