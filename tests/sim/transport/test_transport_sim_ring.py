"""The transport on the simulated four-Spark ring: each rank in its namespace (sr-rN), on
the ring addresses of inventories/sim, talking only over its two ring links."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parents[3]


def _port_args(hostvars: dict) -> list[str]:
    args = []
    for p in hostvars["sparkring_ports"]:
        args += ["--port", f"{p['cage']},{p['address']},{p['peer_rank']},{p['peer_address']}"]
    return args


def test_probe_and_burns_on_the_sim_ring(sim_ring) -> None:
    from sparkring.cluster import load_cluster_file
    from sparkring.hostvars import cluster_hostvars

    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories/sim/cluster.yml"))
    hosts = sorted(hostvars, key=lambda host: hostvars[host]["sparkring_rank"])
    ranks = [hostvars[host] for host in hosts]
    world = len(ranks)
    # The diagonal must be unreachable, or this test would not prove the schedule.
    far = ranks[2]["sparkring_ports"][0]["address"]
    ping = subprocess.run(["ip", "netns", "exec", "sr-r0", "ping", "-c1", "-W1", far], capture_output=True)
    assert ping.returncode != 0, f"rank 2 ({far}) is reachable from rank 0: forwarding is on in the sim ring"
    cmd = [sys.executable, "-m", "transport", "probe", "--world", str(world), "--tcp-port", "28700"]
    cmd += ["--pingpong-iters", "100", "--bw-size", "4194304", "--bw-iters", "2"]
    cmd += ["--burn", "all_reduce,dcp_query_all_gather,lse_combine", "--burn-dtype", "float32,bfloat16"]
    cmd += ["--burn-iters", "100", "--timeout", "20"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            ["ip", "netns", "exec", f"sr-{host}", *cmd, "--rank", str(r), *_port_args(hostvars[host])],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for r, host in enumerate(hosts)
    ]
    docs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(d["ok"] for d in docs), [d["error"] for d in docs]
    for r, doc in enumerate(docs):
        rounds = [(x["peer_rank"], x["cage"]) for x in ranks[r]["sparkring_rounds"]]
        assert [(link["peer_rank"], link["cage"]) for link in doc["links"]] == rounds
        assert all(b["mismatches"] == 0 for b in doc["burns"])
