"""Run the fan-out agent once per rank inside the simulated ring's namespaces (docs/design.md §4).

Each rank is `ip netns exec <netns> python3 module_utils/sparkring_fanout.py run`, fed the
same configuration the sparkring_image_fanout module builds from the inventory, so the bytes
cross real veth ring links: the simulated ring's (`sr-<host>`, from the inventory; `make sim-up`)
or a private ring of bare namespaces with the same geometry (`private_ring`, for a machine
without the sim or while others use it). Shared by the fan-out benchmark and the protocol-level
sim tests; needs root.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

ROOT = Path(__file__).resolve().parents[2]

AGENT = ROOT / "module_utils" / "sparkring_fanout.py"
PYTHON = "/usr/bin/python3"


def inventory_hostvars() -> dict[str, dict]:
    """The sim inventory's hostvars (the plugin's own code path), plus each rank's namespace."""
    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories" / "sim" / "cluster.yml"))
    return {host: {**values, "netns": f"sr-{host}"} for host, values in hostvars.items()}


def ring_links(hostvars: dict, host: str) -> list[dict]:
    return [
        {"peer_rank": p["peer_rank"], "local_address": p["address"], "peer_address": p["peer_address"]}
        for p in hostvars[host]["sparkring_ports"]
    ]


def pair_links(hostvars: dict, sender: str, receiver: str) -> dict[str, list[dict]]:
    """Links of a two-rank run over the one cable joining sender (rank 0) and receiver (rank 1)."""
    port = next(p for p in hostvars[sender]["sparkring_ports"] if p["peer_host"] == receiver)
    return {
        sender: [{"peer_rank": 1, "local_address": port["address"], "peer_address": port["peer_address"]}],
        receiver: [{"peer_rank": 0, "local_address": port["peer_address"], "peer_address": port["address"]}],
    }


def start_agent(host_ns: str, config: dict) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", host_ns, PYTHON, str(AGENT), "run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()
    return proc


def finish(procs: dict[str, subprocess.Popen], timeout: float = 600) -> dict[str, dict]:
    """Wait for every agent; each returns its JSON result (or the failure it printed)."""
    results = {}
    for host, proc in procs.items():
        out = proc.stdout.read()
        proc.stderr.read()
        proc.wait(timeout=timeout)
        results[host] = json.loads(out) if out.strip() else {"failed": True, "msg": f"rc {proc.returncode}"}
    return results


def run_agents(
    hostvars: dict, configs: dict[str, dict], timeout: float = 600
) -> tuple[dict[str, dict], float]:
    """Start one agent per host at once; returns results and the wall time until the last ends."""
    started = time.monotonic()
    procs = {host: start_agent(hostvars[host]["netns"], config) for host, config in configs.items()}
    results = finish(procs, timeout)
    return results, time.monotonic() - started


def ring_interfaces(hostvars: dict) -> list[tuple[str, str]]:
    return [
        (hostvars[host]["netns"], p["interface"])
        for host in sorted(hostvars)
        for p in hostvars[host]["sparkring_ports"]
    ]


def qdisc(ns: str, dev: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", dev, "root"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def shape(hostvars: dict, rate_mbit: int) -> None:
    """tbf on every ring interface (both ends of every cable), refusing to replace someone's shaping."""
    interfaces = ring_interfaces(hostvars)
    for ns, dev in interfaces:
        if "tbf" in qdisc(ns, dev):
            raise RuntimeError(f"{ns} {dev} is already shaped ({qdisc(ns, dev).strip()}); not touching it")
    burst = max(64 * 1024, rate_mbit * 1_000_000 // 8 // 100)  # 10 ms of traffic
    for ns, dev in interfaces:
        tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]
        subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *tbf], check=True
        )


def unshape(hostvars: dict) -> None:
    for ns, dev in ring_interfaces(hostvars):
        if "tbf" in qdisc(ns, dev):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=True)


@contextlib.contextmanager
def private_ring(prefix: str = "im-fanout-", ranks: int = 4, mtu: int = 9000):
    """Bare namespaces cabled like the sim (cable i: rank i .1 <-> rank i+1 .2 in 198.19.i.0/24,
    cage i % 2 on both ends, forwarding off); yields hostvars-shaped facts and removes it all."""
    hosts = [f"r{r}" for r in range(ranks)]
    names = {host: f"{prefix}{host}" for host in hosts}
    hostvars = {
        host: {"sparkring_rank": r, "netns": names[host], "sparkring_ports": []}
        for r, host in enumerate(hosts)
    }
    created = []
    try:
        for host in hosts:
            subprocess.run(["ip", "netns", "add", names[host]], check=True)
            created.append(names[host])
            subprocess.run(
                ["ip", "netns", "exec", names[host], "sysctl", "-qw", "net.ipv4.ip_forward=0"], check=True
            )
            subprocess.run(["ip", "netns", "exec", names[host], "ip", "link", "set", "lo", "up"], check=True)
        for i in range(ranks if ranks > 2 else 1):
            a, b = hosts[i], hosts[(i + 1) % ranks]
            dev = f"ring{i % 2}"
            end_a = ["imtmp-a", "netns", names[a], "mtu", str(mtu)]
            end_b = ["imtmp-b", "netns", names[b], "mtu", str(mtu)]
            subprocess.run(["ip", "link", "add", *end_a, "type", "veth", "peer", "name", *end_b], check=True)
            for host, tmp, last in ((a, "imtmp-a", 1), (b, "imtmp-b", 2)):
                ns = ["ip", "netns", "exec", names[host], "ip"]
                subprocess.run([*ns, "link", "set", tmp, "name", dev], check=True)
                subprocess.run([*ns, "addr", "add", f"198.19.{i}.{last}/24", "dev", dev], check=True)
                subprocess.run([*ns, "link", "set", dev, "up"], check=True)
            for host, peer, last in ((a, b, 1), (b, a, 2)):
                hostvars[host]["sparkring_ports"].append(
                    {
                        "interface": dev,
                        "address": f"198.19.{i}.{last}",
                        "peer_address": f"198.19.{i}.{3 - last}",
                        "peer_rank": hostvars[peer]["sparkring_rank"],
                        "peer_host": peer,
                    }
                )
        yield hostvars
    finally:
        for name in created:
            subprocess.run(["ip", "netns", "del", name], check=False)
