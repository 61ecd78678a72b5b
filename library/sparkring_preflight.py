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
    PCIe link of every RDMA function against its maximum with the board and NIC firmware,
    the GPU and that no other process holds it) and returns one result per check with a
    stable check ID.
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
  sysfs_root:
    description:
      - Where sysfs is mounted. Every link, RDMA, PCIe and DMI fact is read under it; the unit tests
        point it at a sysfs tree they build.
    type: path
    default: /sys
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_ring_port.ports
  - sparkring_docker
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
pcie:
  description:
    - "The board firmware DMI exposes (C(bios_vendor), C(bios_version), C(bios_date), C(board_name),
      C(product_name), where present) and, per RDMA function, its PCI address, trained and maximum
      PCIe speed (GT/s) and width, NIC firmware (C(fw_ver)) and whether it trained at its maximum.
      Empty off the verbs fabric."
  returned: always
  type: dict
  sample:
    board: {bios_version: "<version>", bios_date: "<mm/dd/yyyy>"}
    functions:
      roceP2p1s0f0: {device: roceP2p1s0f0, address: "0002:01:00.0", speed_gt_s: 32.0, width: 2,
                     max_speed_gt_s: 32.0, max_width: 4, firmware: "<fw_ver>", at_maximum: false}
"""

import ipaddress
import os
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError
from ansible.module_utils.sparkring_gpu import (
    COMPUTE_APPS_ARGS,
    GpuQueryError,
    container_id,
    foreign_processes,
    parse_compute_apps,
)
from ansible.module_utils.sparkring_link_facts import (
    SYSFS,
    LinkFactError,
    Runner,
    ipv4_addresses,
    nccl_auto_gid,
    ping,
    rdma_devices,
    read_board_firmware,
    read_link,
    read_pcie_link,
    route_to,
)
from ansible.module_utils.sparkring_model import layout as model_layout
from ansible.module_utils.sparkring_model import layout_problems, record_problems
from ansible.module_utils.sparkring_preflight_checks import (
    CHECK_IDS,
    judge_container_engine,
    judge_disk,
    judge_gpu,
    judge_gpu_free,
    judge_hostname,
    judge_management,
    judge_model,
    judge_nccl_gid,
    judge_non_neighbor,
    judge_pcie,
    judge_port_free,
    skipped,
)
from ansible.module_utils.sparkring_procfs import listening_sockets, socket_holders
from ansible.module_utils.sparkring_ring_checks import (
    RING_PORT_OPTIONS,
    Check,
    jumbo_check,
    jumbo_reply,
    port_argument_problems,
    read_twin,
    twin_checks,
)


def nearest_existing(path: str) -> str:
    """The path itself, or the closest parent that exists (where it would be created)."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


class Preflight:
    """Reads the facts of one rank and turns them into results, in CHECK_IDS order.

    `docker` is the rank's daemon (module_utils/sparkring_docker), None where no docker CLI is installed."""

    def __init__(
        self,
        params: dict[str, Any],
        run: Runner,
        which: Callable[[str, bool], str | None],
        sysfs: str = SYSFS,
        docker: Docker | None = None,
    ) -> None:
        self.p = params
        self.run = run
        self.which = which
        self.sysfs = sysfs
        self.docker = docker
        self.rank = params["rank"]
        self.ports = sorted(params["ports"], key=lambda port: port["cage"])
        self.ip_bin = which("ip", True)
        self.ping_bin = which("ping", True)
        self.gid_indices: dict[str, int] = {}
        self.pcie: dict[str, Any] = {}

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
        out += self._pcie()
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

    def _pcie(self) -> list[Check]:
        """PF-PCIE of every twin's RDMA function (verbs), with the board and NIC firmware in self.pcie."""
        twins = [(port, t) for port in self.ports for t in range(len(port["twins"]))]
        devices = [port["twins"][t].get("rdma_device") for port, t in twins]
        if self.p["fabric"] != "verbs" or not any(devices):
            return [
                skipped(
                    "PF-PCIE",
                    f"r{self.rank}",
                    f"not applicable: fabric {self.p['fabric']}, no RDMA function to check (this node has "
                    f"{', '.join(rdma_devices(self.sysfs)) or 'no RDMA device'}); PCIe links are checked on verbs",
                )
            ]
        board = read_board_firmware(self.sysfs)
        present = set(rdma_devices(self.sysfs))
        out, functions = [], {}
        for (port, t), device in zip(twins, devices, strict=True):
            link = read_pcie_link(device, self.sysfs) if device in present else None
            if link is not None:
                functions[device] = {**asdict(link), "at_maximum": link.at_maximum}
            out.append(judge_pcie(self.rank, port, t, link, board))
        self.pcie = {"board": board, "functions": functions}
        return out

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
                    names = [self._cluster_container(cid) for cid in containers]
                    if None not in names:
                        holders = ours = sorted(names)
            out.append(judge_port_free(item["port"], item["protocol"], item["purpose"], holders, ours))
        return out

    def _container_engine(self) -> Check:
        host = self.p["docker_host"]
        if self.docker is None:
            return judge_container_engine(host, None, "no docker CLI on this node")
        try:
            return judge_container_engine(host, self.docker.ping(), None)
        except DockerError as exc:
            return judge_container_engine(host, None, str(exc))

    def _cluster_container(self, container: str) -> str | None:
        """The container's name when it carries this cluster's label (sparkring.cluster), else None."""
        cluster = self.p["cluster_name"]
        if not cluster or self.docker is None:
            return None
        try:
            info = self.docker.inspect(container) or {}
        except (DockerError, ValueError):
            return None  # a daemon that does not answer: the holder stays foreign (fail closed)
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get("sparkring.cluster") != cluster:
            return None
        return info.get("Name", container[:12]).lstrip("/")

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
            size = sum(int(f["size"]) for f in files)
            shape = f"{len(files)} pinned files, {size} bytes, sizes as pinned, nothing else"
            problems = layout_problems(where.path, files)
            out.append(judge_model(self.rank, model, "PF-MODEL-LAYOUT", problems, shape, required))
            digest, problems = record_problems(where, files)
            record = (
                f"manifest {digest} of {model['name']} {model['revision']}, verified by the model stage; "
                "no file changed since"
            )
            out.append(judge_model(self.rank, model, "PF-MODEL-MANIFEST", problems, record, required))
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

        def is_ours(container: str) -> bool:
            return self._cluster_container(container) is not None

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
            **DOCKER_HOST_OPTION,
            "cluster_name": {"type": "str"},
            "require_gpu": {"type": "bool", "default": False},
            "ping_timeout_s": {"type": "int", "default": 2},
            "models": {"type": "list", "elements": "dict", "default": []},
            "model_required": {"type": "bool", "default": True},
            "sysfs_root": {"type": "path", "default": SYSFS},
        },
        supports_check_mode=True,
    )
    _check_arguments(module)
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}

    def run(argv: list[str]) -> tuple[int, str, str]:
        return module.run_command(argv)

    def which(name: str, required: bool) -> str | None:
        return module.get_bin_path(name, required=required, opt_dirs=["/usr/sbin", "/sbin"])

    docker = Docker(module) if module.get_bin_path("docker") else None
    preflight = Preflight(module.params, run, which, sysfs=module.params["sysfs_root"], docker=docker)
    results = preflight.results()
    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skip")}
    module.exit_json(
        changed=False,
        checks=[asdict(result) for result in results],
        failures=counts["fail"],
        counts=counts,
        gid_indices=preflight.gid_indices,
        pcie=preflight.pcie,
    )


if __name__ == "__main__":
    main()
