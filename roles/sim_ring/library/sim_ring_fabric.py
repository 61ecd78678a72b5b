#!/usr/bin/python
# Copyright: SparkRing contributors
# Apache-2.0
"""Converge the network of the simulated ring: namespaces, management bridge, ring cables, shaping."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sim_ring_fabric
short_description: Network namespaces, veth ring cables and management bridge of the simulated ring
description:
  - Creates (or removes) one network namespace per rank and one controller namespace, the
    management bridge in the controller namespace with one veth per rank attached to it, and
    one veth pair per twin of every ring cable (twin t of one end to twin t of the other, as a
    Spark cage's two functions share its cable) with the exact MTU the inventory gives; the
    first twin gets the port address, the others no IPv4 address.
  - Forwarding is off in every namespace it creates, so ranks that are not cabled to each
    other cannot reach each other over the fabric, as on a real switchless ring.
  - Reads the current state with C(ip -j) and C(tc -j) and changes only what differs, so a
    second run reports no change. Optional C(tc tbf) shaping of ring interfaces.
  - Touches nothing outside the namespaces it is given.
options:
  ranks:
    description:
      - One entry per rank, from the cluster inventory hostvars.
      - Keys C(host), C(rank), C(netns), C(management) (C(interface), C(address), C(prefix))
        and C(ports) (list of C(interface), C(address), C(prefix), C(edge), C(peer_host),
        C(peer_interface), C(twins) (list of C(interface))).
    type: list
    elements: dict
    required: true
  controller_netns:
    description: Namespace that holds the management bridge.
    type: str
    required: true
  bridge:
    description: Name of the management bridge inside O(controller_netns).
    type: str
    default: srmgmt
  bridge_address:
    description: Address of the bridge (C(ADDRESS/PREFIX)); every rank's default route points at it.
    type: str
    required: true
  mtu:
    description: MTU of every ring interface (both ends of every cable).
    type: int
    default: 9000
  shaping:
    description:
      - C(tc tbf) shaping of ring interfaces. Omit (or null) to remove all shaping.
      - C(rate) is C(<number>bit), C(kbit), C(mbit) or C(gbit); C(edges) limits shaping to the
        named cables (empty list, the default, means every cable); C(burst_bytes) defaults to
        10 ms of traffic (at least 64 KiB); C(latency_ms) defaults to 50.
    type: dict
  state:
    description: V(present) creates and converges; V(absent) stops what runs in the namespaces and deletes them.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff lists the commands that were (or would be) run.
  platform:
    platforms: linux
author: SparkRing contributors
"""

EXAMPLES = r"""
- name: Bring the ring network up
  sim_ring_fabric:
    controller_netns: sr-ctl
    bridge_address: 198.19.254.254/24
    ranks: "{{ sim_ring_ranks }}"
    shaping: {rate: 1gbit, edges: [r0-r1]}

- name: Remove it
  sim_ring_fabric:
    controller_netns: sr-ctl
    bridge_address: 198.19.254.254/24
    ranks: "{{ sim_ring_ranks }}"
    state: absent
"""

RETURN = r"""
commands:
  description: The commands run (or, in check mode, that would be run), in order.
  returned: always
  type: list
  elements: str
cables:
  description: The ring cables, C(edge) with its two ends C(host:interface) and each twin pair C(twins).
  returned: always
  type: list
  elements: dict
stopped_pids:
  description: Processes that were still running in a namespace it deleted (state=absent).
  returned: always
  type: list
  elements: int
"""

import ipaddress  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sim_ring_procs import netns_inode, pids_of, terminate  # noqa: E402

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
CTL_PEER = "mgmt{rank}"


def parse_rate_bytes(rate: str) -> int:
    """tc rate text to bytes per second; only bit units, because tc's 'bps' means bytes."""
    match = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)", rate)
    if not match:
        raise ValueError(f"shaping.rate: {rate!r} is not <number>bit|kbit|mbit|gbit (e.g. 1gbit)")
    return int(match.group(1)) * RATE_UNITS[match.group(2)] // 8


def ring_cables(ranks: list[dict]) -> list[dict]:
    """The cables, each claimed by exactly two consistent ends; raises ValueError naming the edge."""
    ends: dict[str, list[tuple[dict, dict]]] = {}
    for rank in ranks:
        for port in rank["ports"]:
            ends.setdefault(port["edge"], []).append((rank, port))
    cables = []
    for edge, claims in ends.items():
        if len(claims) != 2:
            raise ValueError(f"edge {edge}: claimed by {len(claims)} ports, a cable has exactly 2 ends")
        (ra, pa), (rb, pb) = claims
        if (pa["peer_host"], pa["peer_interface"]) != (rb["host"], pb["interface"]) or (
            pb["peer_host"],
            pb["peer_interface"],
        ) != (ra["host"], pa["interface"]):
            raise ValueError(f"edge {edge}: the two ends do not name each other as peers")
        if len(pa["twins"]) != len(pb["twins"]):
            raise ValueError(
                f"edge {edge}: the two ends list {len(pa['twins'])} and {len(pb['twins'])} twins"
            )
        cables.append({"edge": edge, "a": (ra, pa), "b": (rb, pb)})
    return cables


class Fabric:
    """Reads the namespaces' state with ip/tc JSON and runs only the commands that close the gap."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.ip = module.get_bin_path("ip", required=True)
        self.tc = module.get_bin_path("tc", required=True)
        self.commands: list[str] = []
        self.stopped: list[int] = []

    # -- plumbing -------------------------------------------------------------------------
    def query(self, argv: list[str]) -> list[dict]:
        """A JSON query; a namespace that does not exist yet (check mode) reads as empty."""
        rc, out, _ = self.module.run_command(argv, environ_update={"LANG": "C"})
        return json.loads(out) if rc == 0 and out.strip() else []

    def run(self, argv: list[str]) -> None:
        self.commands.append(" ".join(argv))
        if not self.module.check_mode:
            rc, _, err = self.module.run_command(argv, environ_update={"LANG": "C"})
            if rc != 0:
                self.module.fail_json(msg=f"{' '.join(argv)} failed: {err.strip()}", commands=self.commands)

    def exists(self, ns: str) -> bool:
        return netns_inode(f"/run/netns/{ns}") is not None

    def links(self, ns: str) -> dict[str, dict]:
        return {link["ifname"]: link for link in self.query([self.ip, "-n", ns, "-j", "-d", "addr", "show"])}

    # -- converge -------------------------------------------------------------------------
    def namespace(self, ns: str) -> None:
        if not self.exists(ns):
            self.run([self.ip, "netns", "add", ns])
        if "UP" not in self.links(ns).get("lo", {}).get("flags", []):
            self.run([self.ip, "-n", ns, "link", "set", "lo", "up"])
        # New namespaces inherit ip_forward=1: a rank would route between its neighbours.
        rc, out, _ = self.module.run_command(
            [self.ip, "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/ip_forward"]
        )
        if rc != 0 or out.strip() != "0":
            self.run([self.ip, "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0"])

    def veth(self, what: str, a: tuple[str, str], b: tuple[str, str], mtu: int | None) -> None:
        """One veth pair a=(ns, ifname) <-> b=(ns, ifname); half of one is a fault, never guessed at."""
        have_a, have_b = a[1] in self.links(a[0]), b[1] in self.links(b[0])
        if have_a and have_b:
            return
        if have_a or have_b:
            self.module.fail_json(
                msg=f"{what}: only one end exists ({a if have_a else b}); it was changed outside "
                "the sim: run playbooks/sim-down.yml, then playbooks/sim.yml"
            )
        mtu_args = ["mtu", str(mtu)] if mtu else []
        self.run(
            [
                self.ip,
                "-n",
                a[0],
                "link",
                "add",
                a[1],
                *mtu_args,
                "type",
                "veth",
                "peer",
                "name",
                b[1],
                "netns",
                b[0],
                *mtu_args,
            ]
        )

    def interface(
        self, ns: str, ifname: str, cidrs: list[str], mtu: int | None = None, master: str | None = None
    ) -> None:
        """Exact MTU, master, IPv4 addresses (IPv6 link-local is left alone) and link up."""
        link = self.links(ns).get(ifname, {})
        if mtu and link.get("mtu") != mtu:
            self.run([self.ip, "-n", ns, "link", "set", ifname, "mtu", str(mtu)])
        if master and link.get("master") != master:
            self.run([self.ip, "-n", ns, "link", "set", ifname, "master", master])
        have = {
            f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"
        }
        for cidr in sorted(have - set(cidrs)):
            self.run([self.ip, "-n", ns, "addr", "del", cidr, "dev", ifname])
        for cidr in cidrs:
            if cidr not in have:
                self.run([self.ip, "-n", ns, "addr", "add", cidr, "dev", ifname])
        if "UP" not in link.get("flags", []):
            self.run([self.ip, "-n", ns, "link", "set", ifname, "up"])

    def default_route(self, ns: str, gateway: str, dev: str) -> None:
        routes = self.query([self.ip, "-n", ns, "-j", "route", "show", "default"])
        if [(r.get("gateway"), r.get("dev")) for r in routes] != [(gateway, dev)]:
            self.run([self.ip, "-n", ns, "route", "replace", "default", "via", gateway, "dev", dev])

    def shaping(self, ns: str, ifname: str, want: dict | None) -> None:
        root = next(
            (
                q
                for q in self.query([self.tc, "-n", ns, "-j", "qdisc", "show", "dev", ifname])
                if q.get("root")
            ),
            {},
        )
        if want is None:
            if root.get("kind") == "tbf":
                self.run([self.tc, "-n", ns, "qdisc", "del", "dev", ifname, "root"])
            return
        opts = root.get("options", {})
        close = abs(opts.get("burst", 0) - want["burst"]) <= want["burst"] // 100
        if (
            root.get("kind") == "tbf"
            and opts.get("rate") == want["rate"]
            and close
            and opts.get("lat") == want["lat_us"]
        ):
            return
        rate, burst, latency = f"{want['rate'] * 8}bit", str(want["burst"]), f"{want['lat_us']}us"
        qdisc = [self.tc, "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf"]
        self.run([*qdisc, "rate", rate, "burst", burst, "latency", latency])

    def shaping_for(self, edge: str) -> dict | None:
        spec = self.p["shaping"]
        if not spec or (spec.get("edges") and edge not in spec["edges"]):
            return None
        rate = parse_rate_bytes(str(spec.get("rate", "")))
        burst = int(spec.get("burst_bytes") or max(rate // 100, 65536))
        return {"rate": rate, "burst": burst, "lat_us": int(spec.get("latency_ms", 50)) * 1000}

    def present(self, cables: list[dict]) -> None:
        ctl, bridge = self.p["controller_netns"], self.p["bridge"]
        gateway = str(ipaddress.ip_interface(self.p["bridge_address"]).ip)
        self.namespace(ctl)
        if bridge not in self.links(ctl):
            self.run([self.ip, "-n", ctl, "link", "add", bridge, "type", "bridge"])
        self.interface(ctl, bridge, [self.p["bridge_address"]])
        for rank in self.p["ranks"]:
            ns, mgmt = rank["netns"], rank["management"]
            self.namespace(ns)
            peer = CTL_PEER.format(rank=rank["rank"])
            self.veth(f"management link of {rank['host']}", (ns, mgmt["interface"]), (ctl, peer), None)
            self.interface(ctl, peer, [], master=bridge)
            self.interface(ns, mgmt["interface"], [f"{mgmt['address']}/{mgmt['prefix']}"])
            self.default_route(ns, gateway, mgmt["interface"])
        for cable in cables:
            (ra, pa), (rb, pb) = cable["a"], cable["b"]
            for twin, (ta, tb) in enumerate(zip(pa["twins"], pb["twins"], strict=True)):
                self.veth(
                    f"cable {cable['edge']} twin {twin}",
                    (ra["netns"], ta["interface"]),
                    (rb["netns"], tb["interface"]),
                    self.p["mtu"],
                )
            for rank, port in cable["a"], cable["b"]:
                for twin, spec in enumerate(port["twins"]):
                    # The first twin carries the port address; another twin none (as on a Spark).
                    cidrs = [f"{port['address']}/{port['prefix']}"] if twin == 0 else []
                    self.interface(rank["netns"], spec["interface"], cidrs, self.p["mtu"])
                    self.shaping(rank["netns"], spec["interface"], self.shaping_for(cable["edge"]))

    def absent(self) -> None:
        # Ranks first, the controller last: its ProxyCommand netcats serve the ranks' sessions.
        for ns in [r["netns"] for r in self.p["ranks"]] + [self.p["controller_netns"]]:
            ino = netns_inode(f"/run/netns/{ns}")
            if ino is None:
                continue
            pids = pids_of(ino)
            if pids:
                self.commands.append(f"stop {len(pids)} processes in {ns}")
                if not self.module.check_mode:
                    self.stopped += terminate(pids, grace_s=5.0)
            self.run([self.ip, "netns", "del", ns])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "ranks": {"type": "list", "elements": "dict", "required": True},
            "controller_netns": {"type": "str", "required": True},
            "bridge": {"type": "str", "default": "srmgmt"},
            "bridge_address": {"type": "str", "required": True},
            "mtu": {"type": "int", "default": 9000},
            "shaping": {"type": "dict"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        supports_check_mode=True,
    )
    try:
        bridge = ipaddress.ip_interface(module.params["bridge_address"])
        for rank in module.params["ranks"]:
            address = ipaddress.ip_address(rank["management"]["address"])
            if address not in bridge.network or address == bridge.ip:
                raise ValueError(
                    f"{rank['host']}: management address {address} is not a host of the bridge network "
                    f"{bridge.network} other than the bridge itself: set sim_ring_bridge_address to match"
                )
        cables = ring_cables(module.params["ranks"])
        if module.params["shaping"]:
            parse_rate_bytes(str(module.params["shaping"].get("rate", "")))
    except (ValueError, KeyError) as exc:
        module.fail_json(msg=f"sim_ring_fabric: {exc}")
    fabric = Fabric(module)
    if module.params["state"] == "present":
        fabric.present(cables)
    else:
        fabric.absent()
    result = {
        "changed": bool(fabric.commands),
        "commands": fabric.commands,
        "stopped_pids": fabric.stopped,
        "cables": [
            {
                "edge": c["edge"],
                "ends": [
                    f"{c['a'][0]['host']}:{c['a'][1]['interface']}",
                    f"{c['b'][0]['host']}:{c['b'][1]['interface']}",
                ],
                "twins": [
                    [f"{c['a'][0]['host']}:{ta['interface']}", f"{c['b'][0]['host']}:{tb['interface']}"]
                    for ta, tb in zip(c["a"][1]["twins"], c["b"][1]["twins"], strict=True)
                ],
            }
            for c in cables
        ],
    }
    if module._diff:
        result["diff"] = {"prepared": "\n".join(fabric.commands)}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
