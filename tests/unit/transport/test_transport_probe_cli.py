"""The probe CLI as cable qualification runs it: four processes, a short burn, stable JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from transport_ranks import PREFIX

LINK_KEYS = {"peer_rank", "cage", "address", "peer_address", "pingpong", "bandwidth"}
TOP_KEYS = {
    "schema",
    "ok",
    "error",
    "rank",
    "world",
    "fabric",
    "hostname",
    "started_utc",
    "seconds",
    "settings",
    "links",
    "burns",
    "stats",
}


def probe(*args: str) -> list[str]:
    """The probe's command line as qualification starts it, with `args` after it."""
    return [sys.executable, "-m", "transport", "probe", *args]


def ring4_probe(tcp_port: int, *args: str) -> list[str]:
    """The probe for one rank of the four-rank loopback ring (its `--rank` still to add)."""
    return probe("--world", "4", "--ring-prefix", PREFIX, "--tcp-port", str(tcp_port), *args)


def test_probe_qualifies_links_and_burns_byte_exactly() -> None:
    cmd = ring4_probe(
        28670,
        "--pingpong-iters",
        "50",
        "--bw-size",
        "1048576",
        "--bw-iters",
        "2",
        "--burn",
        "all_reduce,lse_combine",
        "--burn-dtype",
        "float32,bfloat16",
        "--burn-iters",
        "100",
        "--timeout",
        "20",
    )
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
    cmd = probe(
        "--rank",
        "0",
        "--world",
        "2",
        "--address",
        "127.77.9.1",
        "--peer-address",
        "127.77.9.2",
        "--tcp-port",
        "28680",
        "--setup-timeout",
        "1",
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and not doc["ok"]
    assert doc["error"].startswith("rank 1 at 127.77.9.2: cannot connect from 127.77.9.1")


def test_probe_reads_its_ring_from_a_ring_spec_on_stdin() -> None:
    """How cable qualification runs it: a two-rank ring on one cable, the ports from stdin."""
    cmd = probe(
        "--ring-spec",
        "-",
        "--tcp-port",
        "28690",
        "--pingpong-iters",
        "20",
        "--bw-size",
        "65536",
        "--bw-iters",
        "4",
        "--burn",
        "none",
    )
    specs = [
        {
            "rank": rank,
            "world": 2,
            "ports": [
                {
                    "cage": 0,
                    "address": f"127.77.9.{rank + 1}",
                    "peer_rank": 1 - rank,
                    "peer_address": f"127.77.9.{2 - rank}",
                    "twins": [],
                }
            ],
        }
        for rank in (0, 1)
    ]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in specs]
    for proc, spec in zip(procs, specs, strict=True):  # both ranks get their ring before either is waited on
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
    docs = [json.loads(p.stdout.read()) for p in procs]
    assert [p.wait(timeout=120) for p in procs] == [0, 0], [d["error"] for d in docs]
    assert [(d["rank"], d["world"], d["links"][0]["peer_rank"]) for d in docs] == [(0, 2, 1), (1, 2, 0)]
    bad = subprocess.run(
        [*cmd, "--rank", "1"], input=json.dumps(specs[0]), capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "--rank 1 contradicts --ring-spec (rank 0)" in bad.stderr


def test_the_flip_hook_makes_a_burn_fail_on_that_rank_only() -> None:
    """The gate's test hook: one rank flips a byte of its first result; only its burns mismatch."""
    cmd = ring4_probe(
        28710,
        "--skip-links",
        "--burn",
        "all_gather,vocab_all_gather",
        "--burn-size",
        "16384,1048576",
        "--burn-iters",
        "20,2",
        "--timeout",
        "20",
    )
    procs = [
        subprocess.Popen(
            [*cmd, "--rank", str(r), *(["--test-flip-result"] if r == 2 else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(4)
    ]
    docs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 1, 0], [d["error"] for d in docs]
    for rank, doc in enumerate(docs):
        assert [(b["collective"], b["size_bytes"], b["iterations"]) for b in doc["burns"]] == [
            ("all_gather", 16384, 20),
            ("all_gather", 1048576, 2),
            ("vocab_all_gather", 16384, 20),
            ("vocab_all_gather", 1048576, 2),
        ]
        assert [b["mismatches"] for b in doc["burns"]] == ([1, 1, 1, 1] if rank == 2 else [0, 0, 0, 0])
    assert docs[2]["error"] == "4 check(s) saw mismatched payloads"
