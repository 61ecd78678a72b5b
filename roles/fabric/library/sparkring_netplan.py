#!/usr/bin/python
"""Ansible module: keep a SparkRing node's ring ports across reboots, in one netplan file it owns."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_netplan
short_description: Write the ring ports of a SparkRing node as one netplan file, validated by netplan
description:
  - Renders the ring ports of this node (each interface with its address, MTU 9000, no DHCP
    or IPv6 router advertisements, so no default route, and C(optional) so that boot never
    waits for a neighbour that is off) as one netplan file that SparkRing owns, the way DGX
    OS (Ubuntu) keeps its network configuration across reboots.
  - Before the file is installed, netplan's own parser and generator check it together with
    every other netplan file of the node (C(netplan generate) in a scratch root), and a ring
    interface that another netplan file also configures is refused, naming that file (netplan
    would merge the two at boot and bring back, for example, DHCP on a ring port).
  - A file of the same name in run/netplan or lib/netplan is refused, naming it. netplan reads one
    file per name (run/ shadows etc/, etc/ shadows lib/), so one in run/ would replace SparkRing's
    and configure no ring port, and SparkRing's would hide one in lib/.
  - Other netplan files are read, never changed. The file lands atomically with mode 0600;
    when it changed and O(apply) is true, C(netplan apply) makes the renderer take it over.
  - Idempotent: an unchanged file is neither rewritten nor applied.
version_added: "0.1.0"
author: SparkRing
options:
  ports:
    description:
      - Each ring interface of this node and its IPv4 address with prefix (CIDR, such as
        198.51.100.1/24), or null for an interface that carries no address (a cage's second
        RDMA twin still gets the MTU and no DHCP).
    type: dict
    required: true
  mtu:
    description: The MTU of every ring interface.
    type: int
    required: true
  root_dir:
    description:
      - The root the netplan directories are under (C(netplan --root-dir)). The file is
        O(root_dir)/etc/netplan/O(file_name); other netplan files are read from
        lib/netplan, etc/netplan and run/netplan under it.
    type: path
    default: /
  file_name:
    description: The name of SparkRing's file in etc/netplan (netplan reads files in name order).
    type: str
    default: 60-sparkring.yaml
  apply:
    description:
      - Run C(netplan apply) when the file changed. Only with O(root_dir=/); the simulated
        ring, whose ranks have no netplan renderer, sets it false.
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Renders and validates the file and reports whether it would change; writes and applies nothing.
  diff_mode:
    support: full
    details: The file's text before and after.
  platform:
    platforms: linux
requirements:
  - netplan (Debian/Ubuntu package C(netplan.io)) on the node.
notes:
  - The run-time state of the ports is sparkring_ring_port's; this module keeps the same
    facts for the next boot.
  - IPv6 link-local addressing is left on (netplan's default). RoCE GID tables list the
    link-local GIDs first, so turning it off would renumber the GID index in cluster.yml.
"""

EXAMPLES = r"""
- name: Keep the ring ports across reboots
  sparkring_netplan:
    ports:
      enp1s0f0np0: 198.51.100.1/24
      enP2p1s0f0np0: null
    mtu: 9000

- name: Render and validate only, in a scratch root (nothing applied)
  sparkring_netplan:
    ports: {ring0: 198.19.0.1/24}
    mtu: 9000
    root_dir: /etc/sparkring/netplan-root
    apply: false
"""

RETURN = r"""
path:
  description: The netplan file SparkRing owns on this node.
  returned: always
  type: str
  sample: /etc/netplan/60-sparkring.yaml
content:
  description: The file's rendered text (what the node holds after the run, or would in check mode).
  returned: always
  type: str
applied:
  description: Whether C(netplan apply) ran.
  returned: always
  type: bool
"""

import fnmatch
import ipaddress
import os
import re
import shutil
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

NETPLAN_DIRS = ("lib/netplan", "etc/netplan", "run/netplan")  # netplan's reading order
FILE_MODE = 0o600  # netplan warns about anything more open
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\.yaml")
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}")
HEADER = """\
# SparkRing: the ring ports of this node, from cluster.yml (roles/fabric, sparkring_netplan).
# SparkRing owns this file and rewrites it on every fabric run: change cluster.yml, not this file.
# No DHCP and no router advertisements on ring ports (so no default route through them);
# optional: boot never waits for a ring neighbour that is off.
"""


def render(ports: dict[str, str | None], mtu: int) -> str:
    """The netplan file for `ports` (interface -> CIDR or None), interfaces in name order."""
    lines = [HEADER.rstrip("\n"), "network:", "  version: 2", "  ethernets:"]
    for interface in sorted(ports):
        lines += [
            f'    "{interface}":',
            "      dhcp4: false",
            "      dhcp6: false",
            "      accept-ra: false",
        ]
        if ports[interface]:
            lines.append(f'      addresses: ["{ports[interface]}"]')
        lines += [f"      mtu: {mtu}", "      optional: true"]
    return "\n".join(lines) + "\n"


def _section_values(text: str, section: str, keys: tuple[str, ...]) -> list[str]:
    """Values of `keys` inside [section] of an INI-style unit or keyfile (networkd, NetworkManager)."""
    values, inside = [], False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            inside = line == f"[{section}]"
        elif inside and "=" in line:
            key, value = line.split("=", 1)
            if key.strip() in keys:
                values += value.split()
    return values


# What netplan generates per definition, and where the interface names and MACs it matches sit.
GENERATED = (
    (
        "run/systemd/network",
        ".network",
        ("Match", ("Name",)),
        ("Match", ("MACAddress", "PermanentMACAddress")),
    ),
    (
        "run/NetworkManager/system-connections",
        ".nmconnection",
        ("connection", ("interface-name",)),
        ("ethernet", ("mac-address",)),
    ),
)


def generated_claims(root: str) -> dict[str, tuple[list[str], list[str]]]:
    """For each backend file netplan generated under `root`: the name globs and MACs it matches."""
    claims = {}
    for folder, suffix, names, macs in GENERATED:
        try:
            files = sorted(name for name in os.listdir(os.path.join(root, folder)) if name.endswith(suffix))
        except OSError:
            continue
        for name in files:
            with open(os.path.join(root, folder, name), encoding="utf-8") as handle:
                text = handle.read()
            claims[name] = (
                _section_values(text, *names),
                [mac.lower() for mac in _section_values(text, *macs)],
            )
    return claims


def _mac(interface: str) -> str | None:
    try:
        with open(f"/sys/class/net/{interface}/address", encoding="ascii") as handle:
            return handle.read().strip().lower()
    except OSError:
        return None


class RingNetplan:
    """Renders, validates, installs and (optionally) applies SparkRing's netplan file."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.root = self.p["root_dir"]
        self.path = os.path.join(self.root, "etc/netplan", self.p["file_name"])

    def check_arguments(self) -> None:
        p = self.p
        if not _FILE_NAME.fullmatch(p["file_name"]):
            self.module.fail_json(
                msg=f"file_name {p['file_name']!r}: expected a plain name ending in .yaml, such as 60-sparkring.yaml"
            )
        if not os.path.isabs(self.root):
            self.module.fail_json(msg=f"root_dir {self.root!r} is not absolute; give the full path")
        if p["apply"] and os.path.realpath(self.root) != "/":
            self.module.fail_json(
                msg=f"apply: netplan apply configures the running system, not root_dir {self.root}; set apply: false"
            )
        if not p["ports"]:
            self.module.fail_json(
                msg="ports: no ring interface given; the fabric role passes sparkring_ports"
            )
        for interface, cidr in p["ports"].items():
            if not _INTERFACE.fullmatch(str(interface)):
                self.module.fail_json(msg=f"ports: {interface!r} is not an interface name; fix cluster.yml")
            if cidr is None:
                continue
            try:
                if "/" not in str(cidr):
                    raise ValueError
                ipaddress.IPv4Interface(str(cidr))
            except ValueError:
                self.module.fail_json(
                    msg=f"ports[{interface}]: {cidr!r} is not an IPv4 address with prefix, such as 198.51.100.1/24"
                )

    def refuse_same_name(self) -> None:
        """netplan reads one file per name (/run shadows /etc, /etc shadows /lib): refuse a namesake."""
        why = {
            "run/netplan": f"netplan reads it instead of {self.path} (a file in /run shadows one of the same "
            "name in /etc), so netplan would configure no ring port. Remove or rename it",
            "lib/netplan": f"{self.path} hides that file from netplan (a file in /etc shadows one of the same "
            "name in /lib), so what it configures would be lost. Remove it if nothing needs it",
        }
        for folder, reason in why.items():
            other = os.path.join(self.root, folder, self.p["file_name"])
            if os.path.lexists(other):
                self.module.fail_json(
                    msg=f"{other} has the name of SparkRing's {self.path}: {reason}, or give SparkRing's file "
                    "another name (fabric_netplan_file); nothing was written"
                )

    def netplan(self, *argv: str) -> tuple[int, str]:
        rc, out, err = self.module.run_command([self.netplan_bin, *argv])
        return rc, (err or out).strip()

    def others(self) -> list[str]:
        """Every other netplan file under root_dir, relative to it (read, never changed)."""
        found = []
        for folder in NETPLAN_DIRS:
            try:
                names = sorted(os.listdir(os.path.join(self.root, folder)))
            except OSError:
                continue
            for name in names:
                relative = os.path.join(folder, name)
                if name.endswith(".yaml") and relative != os.path.join("etc/netplan", self.p["file_name"]):
                    found.append(relative)
        return found

    def scratch_root(self, scratch: str, name: str, others: list[str], content: str | None) -> str:
        """A copy of the node's netplan files under scratch/name, plus the candidate when given."""
        root = os.path.join(scratch, name)
        for relative in others:
            os.makedirs(os.path.join(root, os.path.dirname(relative)), exist_ok=True)
            shutil.copy2(os.path.join(self.root, relative), os.path.join(root, relative))
        if content is not None:
            candidate = os.path.join(root, "etc/netplan", self.p["file_name"])
            os.makedirs(os.path.dirname(candidate), exist_ok=True)
            with open(os.open(candidate, os.O_WRONLY | os.O_CREAT, FILE_MODE), "w", encoding="utf-8") as out:
                out.write(content)
        return root

    def validate(self, content: str) -> None:
        """netplan parses the candidate with every other file; no other file configures a ring port."""
        others = self.others()
        with tempfile.TemporaryDirectory(prefix="sparkring-netplan-") as scratch:
            together = self.scratch_root(scratch, "all", others, content)
            rc, message = self.netplan("generate", "--root-dir", together)
            if rc != 0:
                self.module.fail_json(
                    msg=f"netplan refuses {self.path} with the node's other netplan files: "
                    f"{message.replace(together, self.root.rstrip('/'))}; nothing was written",
                    content=content,
                )
            if others:
                alone = self.scratch_root(scratch, "others", others, None)
                rc, message = self.netplan("generate", "--root-dir", alone)
                if rc != 0:
                    message = message.replace(alone, self.root.rstrip("/"))
                    self.module.fail_json(msg=f"netplan refuses the node's other netplan files: {message}")
                self.refuse_foreign_claims(generated_claims(alone), others)

    def refuse_foreign_claims(
        self, claims: dict[str, tuple[list[str], list[str]]], others: list[str]
    ) -> None:
        """Fail naming the other file(s) when netplan would configure a ring interface from them too."""
        for interface in sorted(self.p["ports"]):
            mac = _mac(interface)
            for unit, (globs, macs) in claims.items():
                if any(fnmatch.fnmatchcase(interface, glob) for glob in globs) or (mac and mac in macs):
                    netplan_id = re.sub(r"^(?:10-)?netplan-|\.(?:network|nmconnection)$", "", unit)
                    named = [rel for rel in others if self.mentions(rel, (interface, netplan_id))] or others
                    files = ", ".join(os.path.join(self.root, rel) for rel in named)
                    self.module.fail_json(
                        msg=f"ring interface {interface} is also configured in {files} (netplan id {netplan_id}): "
                        f"netplan merges that with {self.path} at boot. Remove {interface} from that file; "
                        "SparkRing owns the ring ports"
                    )

    def mentions(self, relative: str, words: tuple[str, ...]) -> bool:
        with open(os.path.join(self.root, relative), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        return any(re.search(rf"(?<![\w.:-]){re.escape(word)}(?![\w.:-])", text) for word in words)

    def current(self) -> tuple[str | None, int | None]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read(), os.stat(self.path).st_mode & 0o777
        except FileNotFoundError:
            return None, None
        except (OSError, UnicodeDecodeError) as error:
            self.module.fail_json(msg=f"cannot read {self.path}: {error}; fix or remove it")

    def install(self, content: str) -> None:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=".sparkring-", dir=folder)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(content)
        os.chmod(tmp, FILE_MODE)
        self.module.atomic_move(tmp, self.path)
        os.chmod(self.path, FILE_MODE)

    def run(self) -> None:
        self.check_arguments()
        self.netplan_bin = self.module.get_bin_path(
            "netplan", required=False, opt_dirs=["/usr/sbin", "/sbin"]
        )
        if not self.netplan_bin:
            self.module.fail_json(
                msg="netplan is not installed on this node: SparkRing keeps the ring ports across reboots "
                "in a netplan file (DGX OS has netplan); install the netplan.io package"
            )
        self.refuse_same_name()
        content = render(self.p["ports"], self.p["mtu"])
        self.validate(content)
        before, mode = self.current()
        changed = before != content or mode != FILE_MODE
        applied = False
        if changed and not self.module.check_mode:
            self.install(content)
            if self.p["apply"]:
                rc, message = self.netplan("apply")
                if rc != 0:
                    self.module.fail_json(
                        msg=f"netplan apply failed after writing {self.path}: {message}; "
                        "`netplan try` or `netplan apply` on the node shows why"
                    )
                applied = True
        result: dict[str, Any] = {
            "changed": changed,
            "path": self.path,
            "content": content,
            "applied": applied,
        }
        if self.module._diff:
            result["diff"] = {
                "before_header": self.path if before is not None else f"{self.path} (absent)",
                "after_header": self.path,
                "before": before or "",
                "after": content,
            }
        self.module.exit_json(**result)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "ports": {"type": "dict", "required": True},
            "mtu": {"type": "int", "required": True},
            "root_dir": {"type": "path", "default": "/"},
            "file_name": {"type": "str", "default": "60-sparkring.yaml"},
            "apply": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    RingNetplan(module).run()


if __name__ == "__main__":
    main()
