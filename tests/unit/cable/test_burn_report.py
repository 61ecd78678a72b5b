"""roles/qualify sparkring_burn_report: every rank's probe document -> one gate verdict naming ranks.

The hostvars are the sim inventory's golden hostvars; each rank's registered command result is
built here the way the burn task registers `python -m transport probe` (JSON on stdout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.project_code import load_project_file

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = {
    "cluster": "sim",
    "check_mode": False,
    "collectives": ["all_reduce"],
    "sizes": [16384],
    "iterations": [200],
    "dtypes": ["float32"],
}


PLUGIN = load_project_file("roles/qualify/filter_plugins/sparkring_qualify.py")


def _burn(mismatches: int = 0) -> dict[str, Any]:
    return {
        "collective": "all_reduce",
        "dtype": "float32",
        "size_bytes": 16384,
        "iterations": 200,
        "mismatches": mismatches,
        "p50_us": 80.0,
        "p99_us": 150.0,
    }


def _run(ok: bool = True, error: str | None = None, burns: list | None = None) -> dict[str, Any]:
    doc = {
        "schema": "sparkring.transport.probe/1",
        "ok": ok,
        "error": error,
        "burns": burns or [_burn()],
        "seconds": 3.2,
        "links": [],
    }
    return {"rc": 0 if ok else 1, "stdout": json.dumps(doc), "stderr": ""}


def _hostvars(runs: dict[str, dict | None]) -> dict[str, Any]:
    golden = json.loads((ROOT / "tests" / "unit" / "inventory" / "golden" / "sim.json").read_text())[
        "hostvars"
    ]
    return {host: {**hv, "qualify_burn_run": runs.get(host)} for host, hv in golden.items()}


HOSTS = ["r0", "r1", "r2", "r3"]


def test_every_rank_clean_passes() -> None:
    report = PLUGIN.sparkring_burn_report(_hostvars({h: _run() for h in HOSTS}), HOSTS, SETTINGS)
    assert (report["schema"], report["status"], report["failures"]) == ("sparkring.burn/1", "passed", [])
    assert report["summary"] == "four-rank burn passed: 4 ranks, 800 collective calls, 0 mismatches"
    assert [r["rank"] for r in report["ranks"]] == [0, 1, 2, 3] and all(r["ok"] for r in report["ranks"])


def test_a_flipped_byte_names_the_rank_the_collective_and_the_size() -> None:
    runs = {h: _run() for h in HOSTS}
    runs["r2"] = _run(ok=False, error="1 check(s) saw mismatched payloads", burns=[_burn(mismatches=1)])
    report = PLUGIN.sparkring_burn_report(_hostvars(runs), HOSTS, SETTINGS)
    assert report["status"] == "failed"
    assert report["failures"] == [
        "rank 2 (r2): 1 check(s) saw mismatched payloads",
        "rank 2 (r2): all_reduce float32 16384 B: 1 of 200 results differ from the reference",
    ]
    assert report["summary"] == "four-rank burn FAILED on 1 rank(s)"


def test_a_timeout_and_a_rank_without_output_fail_naming_them() -> None:
    runs = {h: _run() for h in HOSTS}
    runs["r1"] = _run(
        ok=False, error="all_reduce on rank 1: timed out after 60000 ms waiting for data from rank 2"
    )
    runs["r3"] = {
        "failed": True,
        "msg": "The task was terminated due to timeout after 900 seconds",
        "rc": None,
    }
    report = PLUGIN.sparkring_burn_report(_hostvars(runs), HOSTS, SETTINGS)
    assert report["failures"] == [
        "rank 1 (r1): all_reduce on rank 1: timed out after 60000 ms waiting for data from rank 2",
        "rank 3 (r3): no burn result (exit None): The task was terminated due to timeout after 900 seconds",
    ]


def test_check_mode_skips() -> None:
    runs = {h: {"skipped": True, "changed": False} for h in HOSTS}
    report = PLUGIN.sparkring_burn_report(_hostvars(runs), HOSTS, dict(SETTINGS, check_mode=True))
    assert (report["status"], report["failures"]) == ("skipped", [])
