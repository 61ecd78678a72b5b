#!/usr/bin/python
"""Ansible module: SparkRing's read-only node checks (preflight)."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_preflight
short_description: Read-only checks of one SparkRing rank before anything is deployed
description:
  - Measures one rank of a SparkRing cluster against what the cluster inventory promises
    (hostname, management address, every ring port's carrier, MTU, address and speed, a
    don't-fragment jumbo ping to each neighbour, that non-neighbours are unreachable over
    the fabric, free disk, free ports, the container engine, RDMA ports and RoCE GIDs, the
    GPU and that no other process holds it) and returns one result per check with a stable
    check ID.
  - It changes nothing on the node. A failed check is a result, not a module failure; the
    caller (the C(preflight) role) decides to fail the play. The module fails only on
    arguments it cannot use.
  - A ring port is one cage with its twins (a Spark cage is two netdev/RDMA functions). Every
    twin's link, speed, MTU, addresses and RDMA port and GID are checked by the rules of
    C(module_utils/sparkring_ring_checks), which cable qualification shares; link facts are
    read through C(module_utils/sparkring_link_facts).
version_added: "0.1.0"
author: SparkRing
options:
  rank:
    description: This node's rank.
    type: int
    required: true
  hostname:
    description: The hostname the node must report (PF-SSH proves ssh reached the right node).
    type: str
    required: true
  fabric:
    description: The ring fabric. On C(verbs) every port needs an ACTIVE RDMA port and a RoCE v2 GID.
    type: str
    required: true
    choices: [tcp, verbs]
  mtu:
    description: The MTU every ring port must have.
    type: int
    required: true
  link_speed_mbps:
    description: The exact negotiated speed of every twin where its driver reports one; null skips PF-LINK-SPEED.
    type: int
  management:
    description: The management interface and address (the inventory's C(sparkring_management)).
    type: dict
    required: true
    suboptions:
      interface: {type: str, required: true, description: Interface name.}
      address: {type: str, required: true, description: IPv4 address.}
      prefix: {type: int, required: true, description: Prefix length.}
      cidr: {type: str, description: Address/prefix (informational).}
  ring_addresses:
    description:
      - Every rank's ring addresses, keyed by rank. Ranks that are neither this rank nor a
        peer of one of its ports are non-neighbours whose addresses must not answer over
        the fabric.
    type: dict
    default: {}
  disk:
    description: Paths that need free space; a missing path is measured on its nearest existing parent.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {type: path, required: true, description: Path.}
      min_free_gib: {type: float, required: true, description: Least free GiB.}
  free_ports:
    description: Ports nothing may listen on yet (later stages bind them).
    type: list
    elements: dict
    default: []
    suboptions:
      port: {type: int, required: true, description: Port number.}
      protocol: {type: str, default: tcp, choices: [tcp, udp], description: Protocol.}
      purpose: {type: str, default: '', description: What will bind it (for messages).}
  cluster_name:
    description:
      - The cluster's name. A port or GPU held only by containers labelled C(sparkring.cluster=<name>)
        (this cluster's own deployment, on a re-run) passes PF-PORTS-FREE and PF-GPU-FREE; unset, any
        holder fails them.
    type: str
  docker_host:
    description: The container engine's API socket (C(unix://) URL); PF-CONTAINER-ENGINE pings it.
    type: str
    default: unix:///var/run/docker.sock
  require_gpu:
    description: Fail PF-GPU when no GPU is visible; when false a node without nvidia-smi skips it.
    type: bool
    default: false
  ping_timeout_s:
    description: Seconds to wait for each ping reply.
    type: int
    default: 2
  models:
    description:
      - The models the launch profile serves as the C(sparkring_model_pins) filter pins them (C(name),
        C(revision), C(path), C(files) with each file's C(path), C(size) and C(sha256)). PF-MODEL-LAYOUT
        and PF-MODEL-MANIFEST check each on this rank; none given, they are skipped.
    type: list
    elements: dict
    default: []
  model_required:
    description:
      - Fail PF-MODEL-* when a model directory is missing or differs from its pin. False (site.yml, whose
        model stage runs after preflight and fills or repairs it) reports those as skips naming what differs.
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_ring_port.ports
attributes:
  check_mode:
    support: full
    details: Every check only reads, so check mode runs all of them.
  diff_mode:
    support: none
    details: Nothing changes, so there is no diff.
  platform:
    platforms: posix
notes:
  - Needs C(ip) (iproute2) and C(ping) (iputils) on the node; C(nvidia-smi) where there is a GPU.
"""

EXAMPLES = r"""
- name: Read-only checks of this rank
  sparkring_preflight:
    rank: "{{ sparkring_rank }}"
    hostname: "{{ sparkring_hostname }}"
    fabric: "{{ sparkring_fabric }}"
    mtu: "{{ sparkring_mtu }}"
    link_speed_mbps: "{{ sparkring_link_speed_mbps }}"
    management: "{{ sparkring_management }}"
    ports: "{{ sparkring_ports }}"
    ring_addresses: {0: [198.19.0.1, 198.19.3.2], 2: [198.19.1.2, 198.19.2.1]}
    disk: [{path: /var/lib/sparkring, min_free_gib: 20}]
    free_ports: [{port: 8000, purpose: vLLM API}]
  register: preflight
"""

RETURN = r"""
checks:
  description: One result per check, in a stable order.
  returned: always
  type: list
  elements: dict
  contains:
    id: {description: Stable check ID such as PF-LINK-MTU., type: str}
    status: {description: pass, fail or skip., type: str}
    domain: {description: 'Where a failure lies: node, or a ring domain (link, mtu, addressing, rdma, path).', type: str}
    subject: {description: 'What was checked: the rank, or an edge and twin C(r1 cage1 <-> r2 cage1 (ring1)).', type: str}
    detail: {description: Measured against expected (or why it was skipped)., type: str}
    fix: {description: What to do when it failed (empty otherwise)., type: str}
failures:
  description: How many checks failed.
  returned: always
  type: int
counts:
  description: Number of results per status.
  returned: always
  type: dict
  sample: {pass: 20, fail: 0, skip: 3}
gid_indices:
  description: Resolved RoCE GID index per twin interface (verbs fabric; "auto" resolved).
  returned: always
  type: dict
  sample: {enp1s0f0np0: 3}
"""

import http.client
import ipaddress
import json
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_gpu import (
    COMPUTE_APPS_ARGS,
    GpuProcess,
    GpuQueryError,
    container_id,
    describe,
    foreign_processes,
    parse_compute_apps,
)
from ansible.module_utils.sparkring_link_facts import (
    LINK_LOCAL,
    SYSFS,
    Gid,
    Link,
    LinkFactError,
    Runner,
    ipv4_addresses,
    ipv4_mapped_gid,
    nccl_auto_gid,
    ping,
    read_link,
    route_to,
)
from ansible.module_utils.sparkring_model import layout as model_layout
from ansible.module_utils.sparkring_model import layout_problems, record_problems
from ansible.module_utils.sparkring_ring_checks import (
    RING_PORT_OPTIONS,
    Check,
    jumbo_check,
    jumbo_reply,
    port_argument_problems,
    read_twin,
    twin_checks,
    twin_subject,
)

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
    "PF-GPU",
    "PF-GPU-FREE",
    "PF-MODEL-LAYOUT",
    "PF-MODEL-MANIFEST",
)
GIB = 1024**3
# /proc/net state codes of a listening TCP socket and a bound UDP socket.
_LISTEN_STATE = {"tcp": "0A", "udp": "07"}


def passed(check: str, subject: str, detail: str) -> Check:
    return Check(check, "pass", "node", subject, detail)


def failed(check: str, subject: str, detail: str, fix: str) -> Check:
    return Check(check, "fail", "node", subject, detail, fix)


def skipped(check: str, subject: str, reason: str) -> Check:
    return Check(check, "skip", "node", subject, reason)


# ---- judgements: facts in, results out (pure; the unit tests drive these) ----


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


# ---- fact readers that are preflight's own (not link facts) ----


def listening_sockets(protocol: str, proc: str = "/proc") -> dict[int, set[int]]:
    """Port -> inodes of its listening (TCP) or bound (UDP) sockets in this network namespace."""
    ports: dict[int, set[int]] = {}
    for name in (protocol, protocol + "6"):
        try:
            with open(os.path.join(proc, "net", name), encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN_STATE[protocol]:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                ports.setdefault(port, set()).add(int(fields[9]))
    return ports


def socket_holders(inodes: set[int], proc: str = "/proc") -> dict[int, str]:
    """PID -> command name of every process holding one of these sockets."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = {}
    for pid in filter(str.isdigit, os.listdir(proc)):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            held = any(os.readlink(os.path.join(fd_dir, fd)) in wanted for fd in os.listdir(fd_dir))
            if held:
                with open(os.path.join(proc, pid, "comm"), encoding="utf-8", errors="replace") as handle:
                    holders[int(pid)] = handle.read().strip()
        except OSError:
            continue  # the process ended or is not ours to read
    return holders


def nearest_existing(path: str) -> str:
    """The path itself, or the closest parent that exists (where it would be created)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the Docker API without the docker CLI or SDK."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def docker_get(docker_host: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One GET on the Docker API socket; returns (status, body)."""
    if not docker_host.startswith("unix://"):
        raise ValueError(f"docker_host {docker_host!r} is not a unix:// socket")
    conn = _UnixHTTPConnection(docker_host.removeprefix("unix://"), timeout)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def docker_version(docker_host: str) -> str:
    """GET /_ping then /version; returns the engine version or raises OSError/ValueError."""
    status, body = docker_get(docker_host, "/_ping")
    if status != 200 or body != b"OK":
        raise ValueError(f"/_ping answered {status} {body[:80]!r}")
    version = json.loads(docker_get(docker_host, "/version")[1])
    return f"{version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"


def cluster_container(docker_host: str, container: str, cluster: str) -> str | None:
    """The container's name when it carries this cluster's label (sparkring.cluster), else None."""
    try:
        status, body = docker_get(docker_host, f"/containers/{container}/json")
        info = json.loads(body) if status == 200 else {}
    except (OSError, ValueError, http.client.HTTPException):
        return None
    labels = (info.get("Config") or {}).get("Labels") or {}
    return (
        info.get("Name", container[:12]).lstrip("/") if labels.get("sparkring.cluster") == cluster else None
    )


class Preflight:
    """Reads the facts of one rank and turns them into results, in CHECK_IDS order."""

    def __init__(
        self,
        params: dict[str, Any],
        run: Runner,
        which: Callable[[str, bool], str | None],
        sysfs: str = SYSFS,
    ) -> None:
        self.p = params
        self.run = run
        self.which = which
        self.sysfs = sysfs
        self.rank = params["rank"]
        self.ports = sorted(params["ports"], key=lambda port: port["cage"])
        self.ip_bin = which("ip", True)
        self.ping_bin = which("ping", True)
        self.gid_indices: dict[str, int] = {}

    def _addresses(self, interface: str) -> list[ipaddress.IPv4Interface]:
        try:
            return ipv4_addresses(self.run, interface, ip=self.ip_bin)
        except LinkFactError:
            return []

    def results(self) -> list[Check]:
        out = [judge_hostname(self.rank, self.p["hostname"], socket.gethostname())]
        mgmt = self.p["management"]
        out.append(
            judge_management(
                self.rank,
                mgmt,
                read_link(mgmt["interface"], self.sysfs),
                self._addresses(mgmt["interface"]),
            )
        )
        out += self._ports()
        out += self._non_neighbors()
        for item in self.p["disk"]:
            where = nearest_existing(item["path"])
            stat = os.statvfs(where)
            out.append(judge_disk(item["path"], where, stat.f_bavail * stat.f_frsize, item["min_free_gib"]))
        out += self._free_ports()
        out.append(self._container_engine())
        out.append(self._gpu())
        out.append(self._gpu_free())
        out += self._models()
        order = {check: index for index, check in enumerate(CHECK_IDS)}
        return sorted(out, key=lambda result: order[result.id])

    def _ports(self) -> list[Check]:
        """Every twin of every port by the shared rules, then the jumbo ping of each cable."""
        out = []
        for port in self.ports:
            for twin in range(len(port["twins"])):
                facts = read_twin(port, twin, self.p["fabric"], self.run, self.ip_bin, self.sysfs)
                out += twin_checks(
                    "PF",
                    self.rank,
                    port,
                    twin,
                    facts,
                    fabric=self.p["fabric"],
                    mtu=self.p["mtu"],
                    speed_mbps=self.p["link_speed_mbps"],
                )
                if facts.gid is not None:
                    self.gid_indices[port["twins"][twin]["interface"]] = facts.gid.index
                out += self._nccl_gid(port, twin)
                if twin == 0:
                    reply = jumbo_reply(
                        self.run, port, self.p["mtu"], self.p["ping_timeout_s"], self.ping_bin, facts.link
                    )
                    out.append(jumbo_check("PF", self.rank, port, self.p["mtu"], reply))
        return out

    def _nccl_gid(self, port: dict[str, Any], twin: int) -> list[Check]:
        """On verbs, the GID NCCL will pick on this twin's device (NCCL gets every twin)."""
        spec = port["twins"][twin]
        if self.p["fabric"] != "verbs" or not spec.get("rdma_device") or spec.get("rdma_port") is None:
            return []
        gid = nccl_auto_gid(spec["rdma_device"], spec["rdma_port"], self.sysfs)
        return [judge_nccl_gid(self.rank, port, twin, gid)]

    def _non_neighbors(self) -> list[Check]:
        neighbors = {self.rank} | {port["peer_rank"] for port in self.ports}
        others = {int(rank): addrs for rank, addrs in self.p["ring_addresses"].items()}
        others = {rank: addrs for rank, addrs in others.items() if rank not in neighbors}
        if not others:
            return [
                skipped(
                    "PF-NONNEIGHBOR-UNREACHABLE",
                    f"r{self.rank}",
                    "every other rank is a neighbour (ring of 2 or 3), or ring_addresses was not given",
                )
            ]
        ring_ifaces = [
            port["interface"] for port in self.ports if read_link(port["interface"], self.sysfs).exists
        ]
        probes = [
            (rank, address, iface)
            for rank in sorted(others)
            for address in others[rank]
            for iface in ring_ifaces
        ]

        def answered(probe: tuple[int, str, str]) -> bool:
            _rank, address, iface = probe
            return ping(self.run, address, interface=iface, timeout_s=1, ping_bin=self.ping_bin).answered

        # Bound to a port with no route, the kernel ARPs on-link and waits: probe in parallel.
        with ThreadPoolExecutor(max_workers=8) as pool:
            replies = dict(zip(probes, pool.map(answered, probes), strict=True))
        out = []
        for rank in sorted(others):
            for address in others[rank]:
                over = [iface for iface in ring_ifaces if replies[(rank, address, iface)]]
                route = route_to(self.run, address, ip=self.ip_bin) if over else None
                out.append(judge_non_neighbor(self.rank, rank, address, over, route and route.dev))
        return out

    def _free_ports(self) -> list[Check]:
        listening = {proto: listening_sockets(proto) for proto in ("tcp", "udp")}
        out = []
        for item in self.p["free_ports"]:
            inodes = listening[item["protocol"]].get(item["port"])
            holders, ours = None, []
            if inodes:
                pids = socket_holders(inodes)
                holders = sorted({f"{name} (pid {pid})" for pid, name in pids.items()})
                containers = {container_id(pid) for pid in pids}
                if self.p["cluster_name"] and pids and None not in containers:
                    names = [
                        cluster_container(self.p["docker_host"], cid, self.p["cluster_name"])
                        for cid in containers
                    ]
                    if None not in names:
                        holders = ours = sorted(names)
            out.append(judge_port_free(item["port"], item["protocol"], item["purpose"], holders, ours))
        return out

    def _container_engine(self) -> Check:
        host = self.p["docker_host"]
        try:
            version = docker_version(host)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return failed(
                "PF-CONTAINER-ENGINE",
                host,
                f"the Docker daemon does not answer on {host}: {exc}",
                "install and start Docker (`systemctl enable --now docker`), or set preflight_docker_host",
            )
        return passed("PF-CONTAINER-ENGINE", host, f"Docker {version} answers /_ping")

    def _gpu(self) -> Check:
        smi = self.which("nvidia-smi", False)
        if not smi:
            error = "nvidia-smi not found" if self.p["require_gpu"] else None
            return judge_gpu(self.rank, self.p["require_gpu"], None, error)
        rc, out, err = self.run([smi, "--query-gpu=index,name,uuid", "--format=csv,noheader"])
        gpus = [line.strip() for line in out.splitlines() if line.strip()] if rc == 0 else []
        error = None if rc == 0 else (err or out).strip()[:200] or f"exit {rc}"
        return judge_gpu(self.rank, True, "; ".join(gpus) or None, error)

    def _models(self) -> list[Check]:
        """PF-MODEL-LAYOUT (names and sizes) and PF-MODEL-MANIFEST (the model stage's verified record)."""
        if not self.p["models"]:
            return [
                skipped(
                    check,
                    f"r{self.rank}",
                    "no models to check (preflight_models is empty: the inventory names no launch profile, "
                    "or no model_target/model_draft)",
                )
                for check in ("PF-MODEL-LAYOUT", "PF-MODEL-MANIFEST")
            ]
        out, required = [], self.p["model_required"]
        for model in self.p["models"]:
            where = model_layout(model["path"])
            files = model["files"]
            if not os.path.lexists(where.path):
                out.append(judge_model(self.rank, model, "PF-MODEL-LAYOUT", None, "", required))
                out.append(judge_model(self.rank, model, "PF-MODEL-MANIFEST", None, "", required))
                continue
            layout = layout_problems(where.path, files)
            size = sum(int(f["size"]) for f in files)
            out.append(
                judge_model(
                    self.rank, model, "PF-MODEL-LAYOUT", layout,
                    f"{len(files)} pinned files, {size} bytes, sizes as pinned, nothing else", required,
                )
            )  # fmt: skip
            digest, problems = record_problems(where, files)
            out.append(
                judge_model(
                    self.rank, model, "PF-MODEL-MANIFEST", problems,
                    f"manifest {digest} of {model['name']} {model['revision']}, verified by the model stage; "
                    "no file changed since", required,
                )
            )  # fmt: skip
        return out

    def _gpu_free(self) -> Check:
        smi = self.which("nvidia-smi", False)
        if not smi:
            error = "nvidia-smi not found" if self.p["require_gpu"] else None
            return judge_gpu_free(self.rank, None, error)
        rc, out, err = self.run([smi, *COMPUTE_APPS_ARGS])
        if rc != 0:
            return judge_gpu_free(self.rank, None, (err or out).strip()[:200] or f"nvidia-smi exit {rc}")
        try:
            processes = parse_compute_apps(out)
        except GpuQueryError as exc:
            return judge_gpu_free(self.rank, None, str(exc))
        cluster, host = self.p["cluster_name"], self.p["docker_host"]

        def is_ours(container: str) -> bool:
            return bool(cluster) and cluster_container(host, container, cluster) is not None

        return judge_gpu_free(self.rank, foreign_processes(processes, is_ours), None)


def _check_arguments(module: AnsibleModule) -> None:
    """Refuse what argument_spec cannot express, naming the field and the fix."""
    for port in module.params["ports"]:
        problems = port_argument_problems(port, module.params["fabric"])
        if problems:
            module.fail_json(msg="; ".join(problems))
    for item in module.params["disk"]:
        if not os.path.isabs(item["path"]):
            module.fail_json(msg=f"disk path {item['path']!r} is not absolute; give the full path")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "rank": {"type": "int", "required": True},
            "hostname": {"type": "str", "required": True},
            "fabric": {"type": "str", "required": True, "choices": ["tcp", "verbs"]},
            "mtu": {"type": "int", "required": True},
            "link_speed_mbps": {"type": "int"},
            "management": {
                "type": "dict",
                "required": True,
                "options": {
                    "interface": {"type": "str", "required": True},
                    "address": {"type": "str", "required": True},
                    "prefix": {"type": "int", "required": True},
                    "cidr": {"type": "str"},
                },
            },
            "ports": {"type": "list", "elements": "dict", "required": True, "options": RING_PORT_OPTIONS},
            "ring_addresses": {"type": "dict", "default": {}},
            "disk": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "min_free_gib": {"type": "float", "required": True},
                },
            },
            "free_ports": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "port": {"type": "int", "required": True},
                    "protocol": {"type": "str", "default": "tcp", "choices": ["tcp", "udp"]},
                    "purpose": {"type": "str", "default": ""},
                },
            },
            "docker_host": {"type": "str", "default": "unix:///var/run/docker.sock"},
            "cluster_name": {"type": "str"},
            "require_gpu": {"type": "bool", "default": False},
            "ping_timeout_s": {"type": "int", "default": 2},
            "models": {"type": "list", "elements": "dict", "default": []},
            "model_required": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    _check_arguments(module)
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}

    def run(argv: list[str]) -> tuple[int, str, str]:
        return module.run_command(argv)

    def which(name: str, required: bool) -> str | None:
        return module.get_bin_path(name, required=required, opt_dirs=["/usr/sbin", "/sbin"])

    preflight = Preflight(module.params, run, which)
    results = preflight.results()
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skip")}
    module.exit_json(
        changed=False,
        checks=[asdict(result) for result in results],
        failures=counts["fail"],
        counts=counts,
        gid_indices=preflight.gid_indices,
    )


if __name__ == "__main__":
    main()
