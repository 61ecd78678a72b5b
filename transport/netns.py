"""A private ring of network namespaces for transport tests and benchmarks (root only).

Same shape as the simulated ring (docs/design.md §4) but owned by the caller and torn down
after: rank r is namespace ``<name>-r<r>``; cable i is a veth pair ``ring<cage>`` joining
rank i (.1) and rank i+1 (.2) in ``<prefix>.i.0/24``, MTU 9000, forwarding off, so the
diagonal is unreachable and a schedule that needs it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from transport.topology import cable_geometry


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """None if a private ring can be built here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (ip) is not installed"
    return None


@dataclass
class NetnsRing:
    """Namespaces and cables of one private ring."""

    name: str
    world: int
    prefix: str

    def ns(self, rank: int) -> str:
        return f"{self.name}-r{rank}"

    def exec_argv(self, rank: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(rank), *argv]

    def create(self) -> NetnsRing:
        try:
            for r in range(self.world):
                _ip("netns", "add", self.ns(r))
                _ip("-n", self.ns(r), "link", "set", "lo", "up")
                self.sysctl(r, "net.ipv4.ip_forward", "0")  # new namespaces may inherit 1
            for cable in range(1 if self.world == 2 else self.world):
                a, b = cable, (cable + 1) % self.world
                dev = f"ring{cable % 2}"
                _ip(
                    "link",
                    "add",
                    dev,
                    "netns",
                    self.ns(a),
                    "mtu",
                    "9000",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    dev,
                    "netns",
                    self.ns(b),
                    "mtu",
                    "9000",
                )
            for r in range(self.world):
                for port in cable_geometry(r, self.world, self.prefix).ports:
                    _ip("-n", self.ns(r), "addr", "add", f"{port.address}/24", "dev", f"ring{port.cage}")
                    _ip("-n", self.ns(r), "link", "set", f"ring{port.cage}", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def sysctl(self, rank: int, key: str, value: str) -> None:
        subprocess.run(
            self.exec_argv(rank, ["sysctl", "-qw", f"{key}={value}"]), check=True, capture_output=True
        )

    def route_diagonals(self) -> None:
        """Let traffic cross the ring through a neighbour (for peers such as gloo that need
        every pair): forwarding on, and a route to each non-adjacent cable."""
        for r in range(self.world):
            self.sysctl(r, "net.ipv4.ip_forward", "1")
            for key in ("net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"):
                self.sysctl(r, key, "0")
            ports = {p.peer_rank: p for p in cable_geometry(r, self.world, self.prefix).ports}
            right, left = ports[(r + 1) % self.world], ports[(r - 1) % self.world]
            for cable in range(self.world):
                if r in (cable, (cable + 1) % self.world):
                    continue
                # Go the short way round: cables ahead via the right neighbour, others via the left.
                ahead = (cable - r) % self.world <= self.world // 2 - 1
                via = right if ahead else left
                _ip("-n", self.ns(r), "route", "add", f"{self.prefix}.{cable}.0/24", "via", via.peer_address)

    def shape(self, rate: str) -> None:
        """tc tbf on every ring interface (both ends of every cable): the link, not the CPUs, limits."""
        for r in range(self.world):
            for port in cable_geometry(r, self.world, self.prefix).ports:
                _ip("-n", self.ns(r), "link", "set", f"ring{port.cage}", "up")
                subprocess.run(
                    self.exec_argv(
                        r,
                        [
                            "tc",
                            "qdisc",
                            "replace",
                            "dev",
                            f"ring{port.cage}",
                            "root",
                            "tbf",
                            "rate",
                            rate,
                            "burst",
                            "256kb",
                            "latency",
                            "5ms",
                        ],
                    ),
                    check=True,
                    capture_output=True,
                )

    def unshape(self) -> None:
        for r in range(self.world):
            for port in cable_geometry(r, self.world, self.prefix).ports:
                subprocess.run(
                    self.exec_argv(r, ["tc", "qdisc", "del", "dev", f"ring{port.cage}", "root"]),
                    check=True,
                    capture_output=True,
                )

    def destroy(self) -> None:
        """Delete the namespaces (their veths go with them); only ours, by exact name."""
        for r in range(self.world):
            subprocess.run(["ip", "netns", "delete", self.ns(r)], capture_output=True, check=False)
