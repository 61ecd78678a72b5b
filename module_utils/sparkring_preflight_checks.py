# Copyright: SparkRing contributors. Apache-2.0.
"""Preflight's judgements: the facts of one rank in, one result per check out (pure; stdlib only).

library/sparkring_preflight.py reads the facts and calls these; the unit tests drive them with
facts of their own. The ring-port rules preflight shares with cable qualification live in
sparkring_ring_checks.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ansible.module_utils.sparkring_gpu import GpuProcess, describe
from ansible.module_utils.sparkring_link_facts import (
    LINK_LOCAL,
    Gid,
    Link,
    PcieLink,
    ipv4_mapped_gid,
    pcie_describe,
)
from ansible.module_utils.sparkring_ring_checks import Check, twin_subject

# The order results come out in (and the order of the table in docs/preflight.md).
CHECK_IDS = (
    "PF-SSH",
    "PF-MGMT-ADDR",
    "PF-LINK-UP",
    "PF-LINK-MTU",
    "PF-LINK-ADDR",
    "PF-LINK-SPEED",
    "PF-JUMBO-PING",
    "PF-NONNEIGHBOR-UNREACHABLE",
    "PF-DISK-FREE",
    "PF-PORTS-FREE",
    "PF-CONTAINER-ENGINE",
    "PF-RDMA-BIND",
    "PF-RDMA-PORT",
    "PF-RDMA-GID",
    "PF-NCCL-GID",
    "PF-PCIE",
    "PF-GPU",
    "PF-GPU-FREE",
    "PF-MODEL-LAYOUT",
    "PF-MODEL-MANIFEST",
)
GIB = 1024**3


def passed(check: str, subject: str, detail: str) -> Check:
    return Check(check, "pass", "node", subject, detail)


def failed(check: str, subject: str, detail: str, fix: str) -> Check:
    return Check(check, "fail", "node", subject, detail, fix)


def skipped(check: str, subject: str, reason: str) -> Check:
    return Check(check, "skip", "node", subject, reason)


def judge_hostname(rank: int, expected: str, actual: str) -> Check:
    subject = f"r{rank}"
    if actual == expected:
        return passed("PF-SSH", subject, f"ssh reached the node; hostname {actual}")
    return failed(
        "PF-SSH",
        subject,
        f"ssh reached a node named {actual!r}, expected {expected!r}",
        f"point rank {rank}'s ssh target (ranks[{rank}].host / ssh in cluster.yml) at the node "
        f"named {expected}, or set that node's hostname to {expected}",
    )


def judge_management(
    rank: int, management: dict[str, Any], link: Link, addresses: list[ipaddress.IPv4Interface]
) -> Check:
    iface = management["interface"]
    want = ipaddress.IPv4Interface(f"{management['address']}/{management['prefix']}")
    subject = f"r{rank} {iface}"
    fix = f"configure {want} on {iface} and bring it up, or correct ranks[{rank}].management in cluster.yml"
    if not link.exists:
        return failed("PF-MGMT-ADDR", subject, f"interface {iface} does not exist", fix)
    if want not in addresses:
        found = ", ".join(map(str, addresses)) or "none"
        return failed("PF-MGMT-ADDR", subject, f"IPv4 on {iface}: {found}; expected {want}", fix)
    if not link.up:
        return failed("PF-MGMT-ADDR", subject, f"{iface} has {want} but is {link.operstate}", fix)
    return passed("PF-MGMT-ADDR", subject, f"{iface} up with {want}")


def judge_non_neighbor(
    rank: int, peer: int, address: str, answered_on: list[str], route_dev: str | None
) -> Check:
    subject = f"r{rank} -> r{peer} {address}"
    if not answered_on:
        return passed(
            "PF-NONNEIGHBOR-UNREACHABLE", subject, "no reply over any ring port (expected: unreachable)"
        )
    return failed(
        "PF-NONNEIGHBOR-UNREACHABLE",
        subject,
        f"non-neighbour r{peer} answered over {', '.join(answered_on)} (kernel route via "
        f"{route_dev or 'none'}); expected no path over the fabric",
        "a ring node forwards or routes between its cables: set net.ipv4.ip_forward=0 on the "
        "ranks between them and remove routes to other edges' subnets",
    )


def judge_disk(path: str, measured_on: str, free_bytes: int, min_free_gib: float) -> Check:
    free_gib = free_bytes / GIB
    where = path if measured_on == path else f"{path} (measured on {measured_on})"
    if free_gib >= min_free_gib:
        return passed("PF-DISK-FREE", path, f"{where}: {free_gib:.1f} GiB free, need {min_free_gib:g}")
    return failed(
        "PF-DISK-FREE",
        path,
        f"{where}: {free_gib:.1f} GiB free; expected at least {min_free_gib:g} GiB",
        f"free space on the filesystem holding {measured_on}, or lower the limit in preflight_disk_free",
    )


def judge_port_free(
    port: int, protocol: str, purpose: str, holders: list[str] | None, ours: list[str]
) -> Check:
    """Free, or held only by this cluster's own containers (a re-run: launch replaces them)."""
    subject = f"{port}/{protocol}" + (f" ({purpose})" if purpose else "")
    if holders is None:
        return passed("PF-PORTS-FREE", subject, "nothing listens on it")
    if holders and set(holders) <= set(ours):
        return passed("PF-PORTS-FREE", subject, f"held by this cluster's own container {', '.join(holders)}")
    held = ", ".join(holders) or "a process this node does not show"
    return failed(
        "PF-PORTS-FREE",
        subject,
        f"already listening on {port}/{protocol}: {held}; expected free",
        f"stop what holds it (`ss -lpn 'sport = :{port}'`) or choose another port in preflight_free_ports",
    )


def judge_container_engine(host: str, version: str | None, error: str | None) -> Check:
    """PF-CONTAINER-ENGINE: the rank's Docker daemon answers (its server version) at docker_host."""
    where = host or "the default Docker socket"
    if error is None:
        return passed("PF-CONTAINER-ENGINE", where, f"Docker {version} answers on {where}")
    return failed(
        "PF-CONTAINER-ENGINE",
        where,
        f"the Docker daemon does not answer on {where}: {error}",
        "install and start Docker (`systemctl enable --now docker`), or set preflight_docker_host",
    )


def judge_nccl_gid(rank: int, port: dict[str, Any], twin: int, gid: Gid | None) -> Check:
    """PF-NCCL-GID: the GID NCCL picks itself on a device it is given (NCCL_IB_GID_INDEX=-1, AF_INET,
    RoCE v2; link_facts.nccl_auto_gid follows ncclIbGetGidIndex) is the one the design needs: the
    port's IPv4-mapped RoCE v2 GID on the first twin, a link-local GID on another (which rides with
    its cage in the switchless connector). docs/nccl.md, "Twins"."""
    spec = port["twins"][twin]
    subject, device = (
        twin_subject(rank, port, twin),
        f"{spec.get('rdma_device')} port {spec.get('rdma_port')}",
    )
    found = "no GID" if gid is None else f"index {gid.index} = {gid.gid} ({gid.type})"
    if twin == 0:
        want = ipv4_mapped_gid(port["address"])
        if gid is not None and gid.gid == want and gid.type == "RoCE v2":
            return Check("PF-NCCL-GID", "pass", "rdma", subject, f"NCCL picks {device} {found}")
        return Check(
            "PF-NCCL-GID",
            "fail",
            "rdma",
            subject,
            f"NCCL would pick {device} {found}; expected the RoCE v2 GID of {port['address']} ({want})",
            f"give {spec['interface']} exactly {port['address']} (run the fabric stage): NCCL takes the first "
            "RoCE v2 IPv4 GID of a device, and the connector finds the peer's cable by its /24",
        )
    if gid is not None and gid.gid in LINK_LOCAL:
        return Check(
            "PF-NCCL-GID",
            "pass",
            "rdma",
            subject,
            f"NCCL picks {device} {found} (link-local, rides with its cage)",
        )
    return Check(
        "PF-NCCL-GID",
        "fail",
        "rdma",
        subject,
        f"NCCL would pick {device} {found}; expected a link-local GID (this twin carries no address)",
        f"remove the IPv4 addresses of {spec['interface']} and bring it up with IPv6 link-local addressing "
        "(run the fabric stage)",
    )


# The field (2026): GB10 firmware before 2026-04 trains a cage's second function at PCIe Gen5 x2,
# half its bandwidth, so the cable tops out near one function's ~100 Gb/s.
PCIE_FIX = (
    "update the node's firmware (the DGX Dashboard's system update, or `sudo fwupdmgr refresh && sudo fwupdmgr "
    "update`) and power-cycle it: the field reports GB10 firmware before 2026-04 training a cage's second "
    "function at PCIe Gen5 x2; afterwards `sudo lspci -vv -s {address}` must show LnkSta at the LnkCap speed "
    "and width"
)


def _firmware_text(link: PcieLink, board: dict[str, str]) -> str:
    nic = f"NIC firmware {link.firmware}" if link.firmware else "no NIC firmware version exposed"
    version = " ".join(board[key] for key in ("bios_version", "bios_date") if key in board)
    return nic + (f", board firmware {version}" if version else "")


def judge_pcie(
    rank: int, port: dict[str, Any], twin: int, link: PcieLink | None, board: dict[str, str]
) -> Check:
    """PF-PCIE: the twin's RDMA function trained at the speed and width its PCIe link can reach."""
    spec = port["twins"][twin]
    subject, device = twin_subject(rank, port, twin), spec.get("rdma_device")
    if link is None:
        return Check(
            "PF-PCIE", "skip", "node", subject, f"no RDMA device {device} on this node (see PF-RDMA-BIND)"
        )
    if link.address is None:
        return Check(
            "PF-PCIE",
            "skip",
            "node",
            subject,
            f"not applicable: {device} is not a PCIe function (software RDMA): it has no PCIe link",
        )
    if None in (link.speed_gt_s, link.width, link.max_speed_gt_s, link.max_width):
        return Check(
            "PF-PCIE",
            "skip",
            "node",
            subject,
            f"{device} ({link.address}): the kernel reports no trained PCIe speed and width to compare "
            f"({link.speed_gt_s} GT/s x{link.width}, max {link.max_speed_gt_s} GT/s x{link.max_width})",
        )
    trained, best = (
        pcie_describe(link.speed_gt_s, link.width),
        pcie_describe(link.max_speed_gt_s, link.max_width),
    )
    firmware = _firmware_text(link, board)
    if link.at_maximum:
        return Check(
            "PF-PCIE",
            "pass",
            "node",
            subject,
            f"{device} ({link.address}) PCIe {trained}, its maximum; {firmware}",
        )
    return Check(
        "PF-PCIE",
        "fail",
        "node",
        subject,
        f"{device} ({link.address}) trained at PCIe {trained}, below its maximum {best}: this function moves "
        f"at most {link.speed_gt_s * link.width / (link.max_speed_gt_s * link.max_width):.0%} of its share of the "
        f"cable ({spec['interface']}); {firmware}",
        PCIE_FIX.format(address=link.address),
    )


def judge_gpu(rank: int, require: bool, found: str | None, error: str | None) -> Check:
    subject = f"r{rank}"
    if found:
        return passed("PF-GPU", subject, f"nvidia-smi sees: {found}")
    if not require and error is None:
        return skipped("PF-GPU", subject, "no nvidia-smi on this node and no GPU required")
    return failed(
        "PF-GPU",
        subject,
        f"no GPU visible ({error or 'nvidia-smi listed none'}); expected at least one",
        "install the NVIDIA driver and check `nvidia-smi`",
    )


def judge_model(
    rank: int, model: dict[str, Any], check: str, problems: list[str] | None, detail: str, required: bool
) -> Check:
    """PF-MODEL-LAYOUT or PF-MODEL-MANIFEST of one model: pass, or what differs (a skip when the
    model stage still runs after preflight and puts it right)."""
    subject = f"r{rank} {model['path']}"
    what = f"{model['name']} {model['revision']}"
    if problems is None:
        found = f"{model['path']} does not exist"
    elif problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        found = f"{model['path']} is not {what} as pinned: {shown}"
    else:
        return passed(check, subject, detail)
    if not required:
        return skipped(
            check, subject, f"{found}; the model stage after preflight (site.yml) puts {what} there"
        )
    return failed(
        check,
        subject,
        found,
        "run the model stage (ansible-playbook playbooks/model.yml): it obtains the pinned files once and "
        "re-sends only what differs",
    )


def judge_gpu_free(rank: int, foreign: list[GpuProcess] | None, error: str | None) -> Check:
    """PF-GPU-FREE: no compute process on the GPU but this cluster's own containers.

    ``foreign`` None with no error: there is no nvidia-smi and no GPU is required (skip)."""
    subject = f"r{rank}"
    if error:
        return failed(
            "PF-GPU-FREE",
            subject,
            f"cannot tell who holds the GPU: {error}",
            "check that `nvidia-smi --query-compute-apps=pid,process_name --format=csv` works on the node",
        )
    if foreign is None:
        return skipped("PF-GPU-FREE", subject, "no nvidia-smi on this node and no GPU required")
    if not foreign:
        return passed("PF-GPU-FREE", subject, "no process holds the GPU but this cluster's own containers")
    return failed(
        "PF-GPU-FREE",
        subject,
        f"the GPU is held by {describe(foreign)}; expected free (a GB10 shares its memory with the CPU: "
        "the model would run out of memory at load on this rank after the others started)",
        "stop those processes (`nvidia-smi` lists them; a previous vLLM outside SparkRing, a notebook) "
        "and run again",
    )
