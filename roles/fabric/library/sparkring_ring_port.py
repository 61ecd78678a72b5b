#!/usr/bin/python
"""Ansible module: configure one SparkRing ring port (address, MTU, up, routes, forwarding)."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_ring_port
short_description: Configure one ring port of a SparkRing node from the cluster inventory
description:
  - Brings one ring interface (one twin of a ring port) to exactly the state the inventory
    describes, at run time (C(ip), C(sysctl) in /proc), changing only what differs. Exactly its
    address/prefix (others removed; none at all on a twin without an address), the MTU, link
    up, no route through the port except the connected route of its own cable subnet, and IPv4
    forwarding off on the port.
  - Every ring transfer is between cable neighbours, so the topology needs no forwarding;
    traffic that never enters the FORWARD chain cannot be dropped by Docker's FORWARD
    policy. The global C(net.ipv4.ip_forward) is left to whoever owns it (Docker).
  - Refuses the management interface (by name, or an interface that holds the
    management address) and an interface that does not exist, naming it.
version_added: "0.1.0"
author: SparkRing
options:
  interface:
    description: The ring interface.
    type: str
    required: true
  address:
    description:
      - Its IPv4 address (no prefix). Omit (or null) for a twin that carries no address (the
        second function of a Spark cage); every IPv4 address and route on it is then removed.
    type: str
  prefix:
    description: The cable subnet's prefix length (required with O(address)).
    type: int
  mtu:
    description: The MTU.
    type: int
    required: true
  management_interface:
    description: The management interface; never touched.
    type: str
    required: true
  management_address:
    description: The management address; an interface holding it is never touched.
    type: str
    required: true
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the current state and reports what would change without changing it.
  diff_mode:
    support: full
    details: C(before)/C(after) of address, MTU, state, routes through the port and forwarding.
  platform:
    platforms: linux
notes:
  - Runtime state only; persistence across reboots belongs to the node's network configuration.
"""

EXAMPLES = r"""
- name: Configure the cage 0 ring port
  sparkring_ring_port:
    interface: enp1s0f0np0
    address: 10.0.0.1
    prefix: 24
    mtu: 9000
    management_interface: enP7s7
    management_address: 192.0.2.10
"""

RETURN = r"""
commands:
  description: The commands run (or, in check mode, that would run).
  returned: always
  type: list
  elements: str
  sample: ["ip link set dev ring0 mtu 9000"]
state:
  description: The port's state after the run (before it, in check mode), as in the diff.
  returned: always
  type: dict
"""

import ipaddress
import json
import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_link_facts import ipv4_addresses

PROC_SYS = "/proc/sys"


def _forwarding_path(interface: str) -> str:
    return os.path.join(PROC_SYS, "net", "ipv4", "conf", interface, "forwarding")


class RingPort:
    """Reads one port's state and the commands that make it match the inventory."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.ip = module.get_bin_path("ip", required=True, opt_dirs=["/usr/sbin", "/sbin"])
        address = self.p["address"]
        self.want = ipaddress.IPv4Interface(f"{address}/{self.p['prefix']}") if address else None

    def run(self, argv: list[str]) -> str:
        rc, out, err = self.module.run_command(argv)
        if rc != 0:
            self.module.fail_json(
                msg=f"`{' '.join(argv)}` failed on {self.p['interface']}: {(err or out).strip()}"
            )
        return out

    def state(self) -> dict[str, Any]:
        iface = self.p["interface"]
        link = json.loads(self.run([self.ip, "-j", "link", "show", "dev", iface]))[0]
        routes = json.loads(self.run([self.ip, "-j", "-4", "route", "show", "dev", iface]) or "[]")
        with open(_forwarding_path(iface), encoding="ascii") as handle:
            forwarding = handle.read().strip() == "1"
        addresses = ipv4_addresses(lambda argv: self.module.run_command(argv), iface, ip=self.ip)
        return {
            "addresses": sorted(str(a) for a in addresses),
            "mtu": link["mtu"],
            "up": "UP" in link["flags"],
            # Routes through the port other than its cable's connected route.
            "foreign_routes": sorted(
                r["dst"] for r in routes if self.want is None or r["dst"] != str(self.want.network)
            ),
            "forwarding": forwarding,
        }

    def refuse(self) -> None:
        iface, mgmt = self.p["interface"], self.p["management_interface"]
        if iface == mgmt:
            self.module.fail_json(
                msg=f"refusing to touch {iface}: it is the management interface (sparkring_management); "
                "fix the ring port's interface in cluster.yml"
            )
        if "/" in iface or not os.path.isdir(f"/sys/class/net/{iface}"):
            self.module.fail_json(
                msg=f"ring interface {iface} does not exist on this node; fix its name in cluster.yml "
                "(ranks[].ring_ports[].interface) or check the NIC"
            )
        held = [
            str(a.ip) for a in ipv4_addresses(lambda argv: self.module.run_command(argv), iface, ip=self.ip)
        ]
        if self.p["management_address"] in held:
            self.module.fail_json(
                msg=f"refusing to touch {iface}: it holds the management address {self.p['management_address']} "
                f"(management interface {mgmt}); fix cluster.yml before the fabric stage cuts this node off"
            )

    def plan(self, before: dict[str, Any]) -> tuple[list[list[str]], dict[str, Any]]:
        iface, ip = self.p["interface"], self.ip
        wanted = [str(self.want)] if self.want else []
        after = {
            "addresses": wanted,
            "mtu": self.p["mtu"],
            "up": True,
            "foreign_routes": [],
            "forwarding": False,
        }
        cmds: list[list[str]] = []
        if before["mtu"] != after["mtu"]:
            cmds.append([ip, "link", "set", "dev", iface, "mtu", str(after["mtu"])])
        for extra in before["addresses"]:
            if extra not in wanted:
                cmds.append([ip, "addr", "del", extra, "dev", iface])
        for address in wanted:
            if address not in before["addresses"]:
                cmds.append([ip, "addr", "add", address, "dev", iface])
        if not before["up"]:
            cmds.append([ip, "link", "set", "dev", iface, "up"])
        # A removed address takes its connected route with it: delete only the others.
        dropped = {str(ipaddress.IPv4Interface(a).network) for a in before["addresses"] if a not in wanted}
        for dst in before["foreign_routes"]:
            if dst not in dropped:
                cmds.append([ip, "route", "del", dst, "dev", iface])
        return cmds, after

    def apply(self) -> None:
        self.refuse()
        before = self.state()
        cmds, after = self.plan(before)
        changed = bool(cmds) or before["forwarding"]
        shown = ["ip " + " ".join(argv[1:]) for argv in cmds]
        if before["forwarding"]:
            shown.append(f"sysctl -w net.ipv4.conf.{self.p['interface']}.forwarding=0")
        if changed and not self.module.check_mode:
            for argv in cmds:
                self.run(argv)
            if before["forwarding"]:
                with open(_forwarding_path(self.p["interface"]), "w", encoding="ascii") as handle:
                    handle.write("0\n")
            after = self.state()
        result = {"changed": changed, "commands": shown, "state": before if self.module.check_mode else after}
        if self.module._diff:
            result["diff"] = {
                "before_header": self.p["interface"],
                "after_header": self.p["interface"],
                "before": json.dumps(before, indent=2, sort_keys=True) + "\n",
                "after": json.dumps(after, indent=2, sort_keys=True) + "\n",
            }
        self.module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "interface": {"type": "str", "required": True},
            "address": {"type": "str"},
            "prefix": {"type": "int"},
            "mtu": {"type": "int", "required": True},
            "management_interface": {"type": "str", "required": True},
            "management_address": {"type": "str", "required": True},
        },
        required_by={"address": "prefix"},
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    RingPort(module).apply()


if __name__ == "__main__":
    main()
