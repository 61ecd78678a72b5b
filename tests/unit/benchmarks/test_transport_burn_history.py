"""`python -m benchmarks.transport.bench burn` keeps every burn beside its results file (no torch:
the burn's history is plain Python, so this runs wherever the unit tests do)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.provenance import RunProvenance
from benchmarks.transport.results import write


def test_a_burn_is_kept_after_the_run_seeded_from_git(tmp_path: Path) -> None:
    """The burn keeps every run: a new one is appended after the seeded one, and the results file
    lists both, the seeded run by where it came from."""
    out = tmp_path / "transport_burn.json"
    seeded = {
        "ok": True,
        "mismatches": 0,
        "seconds": 994.9,
        "started_utc": "2026-11-30T12:29:17+00:00",
        "seeded_from": "git show 42eeae2:benchmarks/results/transport_burn.json",
    }
    (tmp_path / "transport_burn-history.jsonl").write_text(json.dumps(seeded) + "\n")
    run = {"ok": False, "mismatches": 3, "seconds": 1.5, "provenance": RunProvenance.capture().finish()}
    write(dict(run), out, ("ok", "mismatches", "seconds"))  # the burn draws no plot
    kept = [json.loads(line) for line in (tmp_path / "transport_burn-history.jsonl").read_text().splitlines()]
    assert kept == [seeded, run]  # a failed burn is kept too, whole
    doc = json.loads(out.read_text())
    assert doc["mismatches"] == 3 and doc["history"]["file"] == "transport_burn-history.jsonl"
    first, last = doc["history"]["runs"]
    assert first["seeded_from"].startswith("git show 42eeae2") and first["seconds"] == 994.9
    assert last["git_commit"] == run["provenance"]["git_commit"] and last["ok"] is False
    assert not (tmp_path / "transport_burn.png").exists()
