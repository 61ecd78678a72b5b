"""The probe CLI as cable qualification runs it: four processes, a short burn, stable JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from transport_ranks import PREFIX

LINK_KEYS = {"peer_rank", "cage", "address", "peer_address", "pingpong", "bandwidth"}
TOP_KEYS = {"schema", "ok", "error", "rank", "world", "fabric", "hostname", "started_utc", "seconds", "settings",
            "links", "burns", "stats"}  # fmt: skip


def test_probe_qualifies_links_and_burns_byte_exactly() -> None:
    cmd = [sys.executable, "-m", "transport", "probe", "--world", "4", "--ring-prefix", PREFIX, "--tcp-port", "28670",
           "--pingpong-iters", "50", "--bw-size", "1048576", "--bw-iters", "2", "--burn", "all_reduce,lse_combine",
           "--burn-dtype", "float32,bfloat16", "--burn-iters", "100", "--timeout", "20"]  # fmt: skip
    procs = [subprocess.Popen([*cmd, "--rank", str(r)], stdout=subprocess.PIPE, text=True) for r in range(4)]
    docs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [d["error"] for d in docs]
    for rank, doc in enumerate(docs):
        assert set(doc) == TOP_KEYS and doc["schema"] == "sparkring.transport.probe/1"
        assert doc["ok"] and doc["error"] is None and doc["rank"] == rank
        assert [link["peer_rank"] for link in doc["links"]] == [rank ^ 1, rank ^ 3]
        assert [link["cage"] for link in doc["links"]] == [0, 1]
        for link in doc["links"]:
            assert set(link) == LINK_KEYS
            assert link["pingpong"]["mismatches"] == 0 and link["pingpong"]["iterations"] == 50
            assert link["bandwidth"]["tx"]["mismatches"] == link["bandwidth"]["rx"]["mismatches"] == 0
        assert [(b["collective"], b["dtype"], b["iterations"], b["mismatches"]) for b in doc["burns"]] == [
            ("all_reduce", "float32", 100, 0),
            ("all_reduce", "bfloat16", 100, 0),
            ("lse_combine", "float32", 100, 0),
            ("lse_combine", "bfloat16", 100, 0),
        ]


def test_probe_reports_an_unreachable_peer_as_json() -> None:
    cmd = [sys.executable, "-m", "transport", "probe", "--rank", "0", "--world", "2", "--address", "127.77.9.1",
           "--peer-address", "127.77.9.2", "--tcp-port", "28680", "--setup-timeout", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and not doc["ok"]
    assert doc["error"].startswith("rank 1 at 127.77.9.2: cannot connect from 127.77.9.1")
