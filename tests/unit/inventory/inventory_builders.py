"""Inventories for the inventory tests: the checked-in files and rings built from the sim rule.

`sim_ring(n)` writes the contract's sim geometry out by hand (cable i joins rank i at .1 and
rank i+1 at .2 in 198.19.i.0/24, cage i % 2 on both ends, twins ring<cage> and ring<cage>b), so
that tests compare the schema and the geometry against an independent statement of the ring.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
INVENTORIES = {
    "ring4": ROOT / "inventories/example/ring4",
    "pair": ROOT / "inventories/example/pair",
    "sim": ROOT / "inventories/sim",
    "sim-pair": ROOT / "inventories/sim-pair",
}

SIM_SSH = {
    "user": "root",
    "private_key_file": "/var/lib/sparkring-sim/ssh/id_ed25519",
    "known_hosts_file": "/var/lib/sparkring-sim/ssh/known_hosts",
    "proxy_command": "ip netns exec sr-ctl nc %h %p",
    "python_interpreter": "/usr/bin/python3",
}


def load_inventory(name: str) -> dict[str, Any]:
    """The parsed cluster.yml of a checked-in inventory."""
    return yaml.safe_load((INVENTORIES[name] / "cluster.yml").read_text(encoding="utf-8"))


def sim_ring(n: int) -> dict[str, Any]:
    """An n-rank ring (n even, >= 4) laid out by the sim rule, as cluster.yml data."""
    edges = [{"id": f"r{i}-r{(i + 1) % n}", "subnet": f"198.19.{i}.0/24"} for i in range(n)]

    def port(cable: int, end: int) -> dict[str, Any]:
        cage = cable % 2
        return {
            "cage": cage,
            "edge": edges[cable]["id"],
            "address": f"198.19.{cable}.{end}",
            "twins": [{"interface": f"ring{cage}"}, {"interface": f"ring{cage}b"}],
        }

    ranks = [
        {
            "rank": r,
            "host": f"r{r}",
            "hostname": f"sim-r{r}",
            "management": {"interface": "mgmt0", "address": f"198.19.254.{10 + r}/24"},
            "ring_ports": sorted([port(r, 1), port((r - 1) % n, 2)], key=lambda p: p["cage"]),
        }
        for r in range(n)
    ]
    return {
        "plugin": "sparkring_cluster",
        "version": 2,
        "cluster": {
            "name": "sim",
            "fabric": "tcp",
            "mtu": 9000,
            "link_speed_mbps": 10000,
            "management_subnet": "198.19.254.0/24",
        },
        "ssh": dict(SIM_SSH),
        "edges": edges,
        "ranks": ranks,
    }


DELETE = object()
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_path(path: str) -> list[str | int]:
    """`ranks[1].ring_ports[0].edge` -> ["ranks", 1, "ring_ports", 0, "edge"]."""
    return [int(index) if index else key for key, index in _PART.findall(path)]


def edit(data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `data` with each `path: value` applied (`DELETE` removes, index len appends)."""
    data = copy.deepcopy(data)
    for path, value in changes.items():
        parts = parse_path(path)
        parent = data
        for part in parts[:-1]:
            parent = parent[part]
        if value is DELETE:
            del parent[parts[-1]]
        elif isinstance(parent, list) and parts[-1] == len(parent):
            parent.append(value)
        else:
            parent[parts[-1]] = value
    return data
