"""The probe on a private four-namespace ring (tp-*): only ring links exist, the diagonal
is unreachable, so a schedule that needed it would fail here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transport import netns

pytestmark = [
    pytest.mark.sim,
    pytest.mark.skipif(netns.available() is not None, reason=str(netns.available())),
]
PREFIX = "10.77"


@pytest.fixture
def ring():
    r = netns.NetnsRing(f"tp-{os.getpid() % 100000}", 4, PREFIX).create()
    yield r
    r.destroy()


def test_probe_runs_on_ring_links_only(ring: netns.NetnsRing) -> None:
    diagonal = subprocess.run(ring.exec_argv(0, ["ping", "-c1", "-W1", f"{PREFIX}.1.2"]), capture_output=True)
    assert diagonal.returncode != 0, "rank 2 must be unreachable from rank 0"
    cmd = [sys.executable, "-m", "transport", "probe", "--world", "4", "--ring-prefix", PREFIX]
    cmd += ["--pingpong-iters", "100", "--bw-size", "4194304", "--bw-iters", "2"]
    cmd += ["--burn", "all_reduce,vocab_all_gather", "--burn-dtype", "float32,bfloat16"]
    cmd += ["--burn-iters", "100", "--burn-size", "65536", "--timeout", "20"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [
        subprocess.Popen(
            ring.exec_argv(r, [*cmd, "--rank", str(r)]), stdout=subprocess.PIPE, text=True, env=env
        )
        for r in range(4)
    ]
    docs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(d["ok"] for d in docs), [d["error"] for d in docs]
    for rank, doc in enumerate(docs):
        assert [(link["peer_rank"], link["cage"]) for link in doc["links"]] == [(rank ^ 1, 0), (rank ^ 3, 1)]
        assert all(b["mismatches"] == 0 and b["iterations"] == 100 for b in doc["burns"])


def test_all_reduce_over_a_namespace_pair(ring: netns.NetnsRing) -> None:
    # Two of the four namespaces as an N=2 pair on cable 0 (exchange-and-add).
    cmd = [sys.executable, "-m", "transport", "probe", "--world", "2", "--skip-links"]
    cmd += ["--burn", "all_reduce", "--burn-dtype", "float16", "--burn-iters", "100"]
    addrs = [f"{PREFIX}.0.1", f"{PREFIX}.0.2"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [
        subprocess.Popen(
            ring.exec_argv(
                r, [*cmd, "--rank", str(r), "--address", addrs[r], "--peer-address", addrs[1 - r]]
            ),
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    docs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(d["ok"] and d["burns"][0]["mismatches"] == 0 for d in docs), [d["error"] for d in docs]
