"""The node-side checks of one ring port, shared by preflight (PF-) and cable qualification (CQ-).

One contract for both modules. `RING_PORT_OPTIONS` is the argument spec of a ring port (one
element of the inventory's `sparkring_ports`; plugins/doc_fragments/sparkring_ring_port.py
documents it), and the link, speed, MTU, address, jumbo-ping and RDMA checks of each of the
port's twins are written here once, one rule each. A check's ID is `<prefix>-<name>`
(PF-LINK-MTU in preflight, CQ-LINK-MTU in qualification); every check carries the failure
domain a cable verdict orders by (`DOMAINS`, most basic first) and the subject a person finds
it by.

A port is one cage. Its twins are the cage's functions (a Spark cage is two x4 netdev/RDMA
functions of ~100 Gb/s each): the first carries the port address and its IPv4-mapped RoCE v2
GID; another twin carries no IPv4 address and moves RDMA over its link-local RoCE v2 GID.
Standard library only: it ships to the nodes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

try:  # inside an Ansible module
    from ansible.module_utils.sparkring_link_facts import (
        Gid,
        Link,
        LinkFactError,
        PingResult,
        RdmaPort,
        Runner,
        find_link_local_roce_v2_gid,
        find_roce_v2_gid,
        gid_table_length,
        ipv4_addresses,
        ipv4_mapped_gid,
        jumbo_payload,
        ping,
        rdma_devices,
        rdma_netdevs,
        read_gid,
        read_link,
        read_rdma_port,
    )
except ImportError:  # loaded by path next to it (the qualify filter on the controller)
    from sparkring_link_facts import (  # type: ignore[no-redef]
        Gid,
        Link,
        LinkFactError,
        PingResult,
        RdmaPort,
        Runner,
        find_link_local_roce_v2_gid,
        find_roce_v2_gid,
        gid_table_length,
        ipv4_addresses,
        ipv4_mapped_gid,
        jumbo_payload,
        ping,
        rdma_devices,
        rdma_netdevs,
        read_gid,
        read_link,
        read_rdma_port,
    )

# Where a failed check puts a cable, most basic first: a verdict names the first that failed.
DOMAINS = ("link", "cabling", "mtu", "addressing", "rdma", "path", "transport", "errors", "performance")

TWIN_OPTIONS: dict[str, Any] = {
    "interface": {"type": "str", "required": True},
    "address": {"type": "str"},
    "rdma_device": {"type": "str"},
    "rdma_port": {"type": "int"},
    "gid_index": {"type": "raw"},
}

# One element of the inventory's sparkring_ports, as both modules take it.
RING_PORT_OPTIONS: dict[str, Any] = {
    "cage": {"type": "int", "required": True},
    "interface": {"type": "str", "required": True},
    "edge": {"type": "str", "required": True},
    "address": {"type": "str", "required": True},
    "prefix": {"type": "int", "required": True},
    "cidr": {"type": "str"},
    "subnet": {"type": "str"},
    "twins": {"type": "list", "elements": "dict", "required": True, "options": TWIN_OPTIONS},
    "peer_rank": {"type": "int", "required": True},
    "peer_host": {"type": "str", "required": True},
    "peer_address": {"type": "str", "required": True},
    "peer_interface": {"type": "str"},
    "peer_cage": {"type": "int", "required": True},
}


@dataclass(frozen=True)
class Check:
    """One check outcome: ID, pass|warn|fail|skip, failure domain, what was checked, why, the fix."""

    id: str
    status: str
    domain: str
    subject: str
    detail: str
    fix: str = ""


def edge_subject(rank: int, port: dict[str, Any]) -> str:
    """The cable as a person finds it: both ends by rank and cage."""
    return f"r{rank} cage{port['cage']} <-> r{port['peer_rank']} cage{port['peer_cage']}"


def twin_subject(rank: int, port: dict[str, Any], twin: int) -> str:
    """One twin of a cable end: the cable, and the interface at this end."""
    return f"{edge_subject(rank, port)} ({port['twins'][twin]['interface']})"


def port_argument_problems(port: dict[str, Any], fabric: str) -> list[str]:
    """What argument_spec cannot refuse in a port, each naming the field and the fix."""
    where = f"port cage {port['cage']}"
    problems = []
    for name in ("address", "peer_address"):
        try:
            ipaddress.IPv4Address(port[name])
        except ValueError:
            problems.append(f"{where}.{name}: {port[name]!r} is not an IPv4 address; fix cluster.yml")
    if not port["twins"]:
        problems.append(f"{where}.twins: empty; every port has at least one twin (its interface)")
    for t, twin in enumerate(port["twins"]):
        index = twin.get("gid_index")
        if fabric == "verbs" and (not twin.get("rdma_device") or twin.get("rdma_port") is None):
            problems.append(
                f"{where}.twins[{t}] ({twin['interface']}): fabric verbs needs rdma_device and rdma_port; "
                "add rdma to the twin in cluster.yml"
            )
        if index is not None and index != "auto" and not str(index).isdigit():
            problems.append(f"{where}.twins[{t}].gid_index: {index!r} is neither a number nor 'auto'")
    return problems


# ---- facts of one twin, read on the node --------------------------------------------------


@dataclass
class TwinFacts:
    """What the node says about one twin: its link, IPv4 addresses and (verbs) RDMA port."""

    link: Link
    addresses: list[ipaddress.IPv4Interface] = field(default_factory=list)
    address_error: str | None = None
    rdma: RdmaPort | None = None
    bound: set[str] = field(default_factory=set)
    gid: Gid | None = None
    gid_table_length: int | None = None
    present: list[str] = field(default_factory=list)  # the node's RDMA devices, when this one is missing


def read_twin(port: dict[str, Any], twin: int, fabric: str, run: Runner, ip: str, sysfs: str) -> TwinFacts:
    """Read one twin's facts; RDMA ones only on the verbs fabric."""
    spec = port["twins"][twin]
    facts = TwinFacts(link=read_link(spec["interface"], sysfs))
    if facts.link.exists:
        try:
            facts.addresses = ipv4_addresses(run, spec["interface"], ip=ip)
        except LinkFactError as exc:
            facts.address_error = str(exc)
    device, number = spec.get("rdma_device"), spec.get("rdma_port")
    if fabric == "verbs" and device and number is not None:
        facts.rdma = read_rdma_port(device, number, sysfs)
        if not facts.rdma.exists:
            facts.present = rdma_devices(sysfs)
        facts.bound = rdma_netdevs(device, number, sysfs)
        facts.gid_table_length = gid_table_length(device, number, sysfs)
        index = spec.get("gid_index")
        if index in (None, "auto"):
            facts.gid = (
                find_roce_v2_gid(device, number, port["address"], sysfs)
                if twin == 0
                else find_link_local_roce_v2_gid(device, number, sysfs)
            )
        else:
            facts.gid = read_gid(device, number, int(index), sysfs)
    return facts


def jumbo_reply(
    run: Runner, port: dict[str, Any], mtu: int, timeout_s: int, ping_bin: str, link: Link
) -> PingResult | None:
    """A don't-fragment ping that fills the MTU, from the address twin to the peer (None: link down)."""
    if not link.up:
        return None
    return ping(
        run,
        port["peer_address"],
        interface=port["interface"],
        payload_bytes=jumbo_payload(mtu),
        dont_fragment=True,
        count=2,
        timeout_s=timeout_s,
        ping_bin=ping_bin,
    )


# ---- the checks: facts in, checks out (pure) ----------------------------------------------


def _both_ends(rank: int, port: dict[str, Any], twin: int) -> str:
    return f"r{rank} {port['twins'][twin]['interface']} and r{port['peer_rank']} {port.get('peer_interface') or 'its port'}"


def link_checks(
    prefix: str, rank: int, port: dict[str, Any], twin: int, link: Link, mtu: int, speed_mbps: int | None
) -> list[Check]:
    """<prefix>-LINK-UP, -LINK-SPEED (exactly the inventory's, where the driver reports one), -LINK-MTU."""
    subject, iface = twin_subject(rank, port, twin), link.interface
    up, speed, mtu_id = f"{prefix}-LINK-UP", f"{prefix}-LINK-SPEED", f"{prefix}-LINK-MTU"
    if not link.exists:
        gone = f"{iface} does not exist (see {up})"
        return [
            Check(
                up,
                "fail",
                "link",
                subject,
                f"interface {iface} does not exist",
                f"check the NIC in r{rank} cage{port['cage']} and the twin interfaces of ranks[{rank}].ring_ports "
                f"cage {port['cage']} in cluster.yml (`ibdev2netdev` lists them)",
            ),
            Check(speed, "skip", "link", subject, gone),
            Check(mtu_id, "skip", "mtu", subject, gone),
        ]
    out = []
    if link.up:
        out.append(Check(up, "pass", "link", subject, f"{iface} {link.operstate}, carrier on"))
    else:
        out.append(
            Check(
                up,
                "fail",
                "link",
                subject,
                f"{iface} is {link.operstate} (carrier {'on' if link.carrier else 'off'}); expected up with carrier",
                f"seat the cable {edge_subject(rank, port)} and bring {_both_ends(rank, port, twin)} up "
                f"(`ip link set {iface} up`; run the fabric stage)",
            )
        )
    if speed_mbps is None:
        out.append(Check(speed, "skip", "link", subject, "link_speed_mbps is null in cluster.yml"))
    elif link.speed_mbps is None:
        out.append(Check(speed, "skip", "link", subject, f"the driver of {iface} reports no speed"))
    elif link.speed_mbps == speed_mbps:
        out.append(Check(speed, "pass", "link", subject, f"{iface} {link.speed_mbps} Mb/s"))
    else:
        out.append(
            Check(
                speed,
                "fail",
                "link",
                subject,
                f"{iface} negotiated {link.speed_mbps} Mb/s, expected {speed_mbps}",
                f"reseat or replace the cable/transceivers; compare `ethtool {iface}` on both ends, or correct "
                "cluster.link_speed_mbps in cluster.yml",
            )
        )
    if link.mtu == mtu:
        out.append(Check(mtu_id, "pass", "mtu", subject, f"{iface} MTU {mtu}"))
    else:
        out.append(
            Check(
                mtu_id,
                "fail",
                "mtu",
                subject,
                f"{iface} MTU {link.mtu}, expected {mtu}",
                f"set MTU {mtu} on {_both_ends(rank, port, twin)} (run the fabric stage)",
            )
        )
    return out


def address_check(prefix: str, rank: int, port: dict[str, Any], twin: int, facts: TwinFacts) -> Check:
    """<prefix>-LINK-ADDR: the first twin holds exactly the port address, another twin no IPv4 at all."""
    cid, subject = f"{prefix}-LINK-ADDR", twin_subject(rank, port, twin)
    iface = port["twins"][twin]["interface"]
    if not facts.link.exists:
        return Check(cid, "skip", "addressing", subject, f"{iface} does not exist (see {prefix}-LINK-UP)")
    if facts.address_error is not None:
        return Check(cid, "fail", "addressing", subject, facts.address_error, "check iproute2 on the node")
    found = ", ".join(map(str, facts.addresses)) or "none"
    if twin == 0:
        want = [ipaddress.IPv4Interface(f"{port['address']}/{port['prefix']}")]
        expected = f"exactly {want[0]}"
        fix = (
            f"give {iface} exactly {want[0]} (run the fabric stage), or correct ranks[{rank}].ring_ports "
            f"cage {port['cage']} in cluster.yml"
        )
    else:
        want, expected = [], "none (its cage's address lives on its first twin)"
        fix = (
            f"remove the IPv4 addresses of {iface} (run the fabric stage): a second address of the cable on "
            "this node splits its ARP and routes"
        )
    if facts.addresses == want:
        return Check(cid, "pass", "addressing", subject, f"{iface} IPv4: {found}")
    return Check(cid, "fail", "addressing", subject, f"{iface} IPv4: {found}; expected {expected}", fix)


def jumbo_check(prefix: str, rank: int, port: dict[str, Any], mtu: int, reply: PingResult | None) -> Check:
    """<prefix>-JUMBO-PING from the address twin (skip when its link is down)."""
    cid, subject = f"{prefix}-JUMBO-PING", twin_subject(rank, port, 0)
    if reply is None:
        return Check(cid, "skip", "path", subject, f"link is not up (see {prefix}-LINK-UP)")
    probe = f"DF ping of {jumbo_payload(mtu)} B from {port['interface']} to {port['peer_address']}"
    if reply.answered:
        return Check(cid, "pass", "path", subject, f"{probe}: {reply.received}/{reply.transmitted} replies")
    return Check(
        cid,
        "fail",
        "path",
        subject,
        f"{probe}: {reply.error}; expected a reply at MTU {mtu}",
        f"MTU {mtu}, the addresses and the link must hold on both ends ({_both_ends(rank, port, 0)}): see this "
        f"edge's other {prefix}-LINK-* results on r{rank} and r{port['peer_rank']}, and that no firewall drops "
        "ICMP on the ring",
    )


def rdma_checks(
    prefix: str, rank: int, port: dict[str, Any], twin: int, fabric: str, facts: TwinFacts
) -> list[Check]:
    """<prefix>-RDMA-BIND, -RDMA-PORT and -RDMA-GID of one twin (skipped off the verbs fabric)."""
    ids = [f"{prefix}-RDMA-{name}" for name in ("BIND", "PORT", "GID")]
    subject, spec = twin_subject(rank, port, twin), port["twins"][twin]
    if fabric != "verbs":
        return [Check(cid, "skip", "rdma", subject, f"fabric {fabric}: no RDMA device") for cid in ids]
    device, number, iface = spec.get("rdma_device"), spec.get("rdma_port"), spec["interface"]
    name = f"{device} port {number}"
    where = f"ranks[{rank}].ring_ports cage {port['cage']} twins[{twin}].rdma in cluster.yml"
    bind, state_id, gid_id = ids
    if facts.rdma is None or not facts.rdma.exists:
        fix = (
            f"load the RDMA driver (mlx5_ib), check `ibv_devinfo -d {device}` and `ibdev2netdev` (this node has "
            f"{', '.join(facts.present) or 'no RDMA device'}), or correct {where}"
        )
        return [
            Check(bind, "fail", "rdma", subject, f"RDMA {name} does not exist on this node", fix),
            Check(state_id, "skip", "rdma", subject, f"no {name} (see {bind})"),
            Check(gid_id, "skip", "rdma", subject, f"no {name} (see {bind})"),
        ]
    out = []
    if iface in facts.bound:
        out.append(Check(bind, "pass", "rdma", subject, f"{name} is bound to {iface}"))
    else:
        out.append(
            Check(
                bind,
                "fail",
                "rdma",
                subject,
                f"{name} is bound to {sorted(facts.bound) or 'no netdev'}; expected {iface}",
                f"`ibdev2netdev` shows which device sits on {iface}: correct {where}",
            )
        )
    if facts.rdma.active:
        out.append(Check(state_id, "pass", "rdma", subject, f"{name} ACTIVE ({facts.rdma.phys_state})"))
    else:
        out.append(
            Check(
                state_id,
                "fail",
                "rdma",
                subject,
                f"{name} is {facts.rdma.state} (physical {facts.rdma.phys_state}); expected ACTIVE",
                f"bring {iface} up with its cable seated; `ibv_devinfo -d {device}` must show PORT_ACTIVE",
            )
        )
    out.append(_gid_check(gid_id, subject, port, twin, facts, name, where))
    return out


def _gid_check(
    cid: str, subject: str, port: dict[str, Any], twin: int, facts: TwinFacts, name: str, where: str
) -> Check:
    """The first twin's GID is its address IPv4-mapped, another twin's is link-local; RoCE v2 on its netdev."""
    spec, index = port["twins"][twin], port["twins"][twin].get("gid_index")
    iface = spec["interface"]
    if twin == 0:
        want = f"{ipv4_mapped_gid(port['address'])}"
        fix = f"{iface} needs {port['address']} (RoCE v2 derives the GID from it); set gid_index of {where} to auto or the index `show_gids` lists"
    else:
        want = "a link-local fe80::/64 GID"
        fix = f"bring {iface} up with IPv6 link-local addressing, or set gid_index of {where} to auto or the index `show_gids` lists"
    length = facts.gid_table_length
    if index not in (None, "auto") and length is not None and int(index) >= length:
        return Check(
            cid,
            "fail",
            "rdma",
            subject,
            f"{name}: gid_index {index} is past the end of its GID table (gid_tbl_len {length}): expected 0-{length - 1} or auto",
            fix,
        )
    gid = facts.gid
    if gid is None:
        missing = "no RoCE v2 entry" if index in (None, "auto") else f"index {index} is empty"
        return Check(cid, "fail", "rdma", subject, f"{name}: {missing}; expected RoCE v2 {want}", fix)
    problems = []
    matches = (
        gid.gid == ipaddress.IPv6Address(want) if twin == 0 else gid.gid in ipaddress.IPv6Network("fe80::/64")
    )
    if not matches:
        problems.append(f"GID {gid.gid} (expected {want})")
    if gid.type != "RoCE v2":
        problems.append(f"type {gid.type} (expected RoCE v2)")
    if gid.netdev not in (None, iface):
        problems.append(f"netdev {gid.netdev} (expected {iface})")
    if problems:
        return Check(
            cid, "fail", "rdma", subject, f"{name} GID index {gid.index}: " + "; ".join(problems), fix
        )
    resolved = " (auto)" if index in (None, "auto") else ""
    return Check(cid, "pass", "rdma", subject, f"{name} GID index {gid.index}{resolved} = {gid.gid}, RoCE v2")


def twin_checks(
    prefix: str,
    rank: int,
    port: dict[str, Any],
    twin: int,
    facts: TwinFacts,
    *,
    fabric: str,
    mtu: int,
    speed_mbps: int | None,
) -> list[Check]:
    """Every shared check of one twin except the jumbo ping: link, speed, MTU, address, RDMA."""
    out = link_checks(prefix, rank, port, twin, facts.link, mtu, speed_mbps)
    out.append(address_check(prefix, rank, port, twin, facts))
    return out + rdma_checks(prefix, rank, port, twin, fabric, facts)


def verdict(checks: list[Check]) -> dict[str, Any]:
    """qualified / qualified_with_warning / failed (the first failed domain, most basic first)."""
    failed = sorted((c for c in checks if c.status == "fail"), key=lambda c: DOMAINS.index(c.domain))
    warned = [c for c in checks if c.status == "warn"]
    reasons = [f"{c.id}: {c.detail}" for c in failed + warned]
    if failed:
        return {
            "status": "failed",
            "failure_domain": failed[0].domain,
            "fix": failed[0].fix,
            "reasons": reasons,
        }
    status = "qualified_with_warning" if warned else "qualified"
    return {"status": status, "failure_domain": None, "fix": "", "reasons": reasons}
