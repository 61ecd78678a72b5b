"""Every committed results file under benchmarks/results names how it was made: the provenance
record of benchmarks/provenance.py (command line, commit, cores, load at start and end, UTC times),
for each results file and each run kept in a history. The files recorded before results carried
it are listed here by name with what it would take to replace them; a new file without it fails,
and so does a listed file once a re-run gave it a provenance (take it off the list)."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
# What issue 18 asks each file to say (the helper records these and more: cpu_model, git_dirty).
KEYS = {"command", "git_commit", "cpu_cores", "started_utc", "load_avg_start", "finished_utc", "load_avg_end"}
# Recorded before the provenance helper; each needs a re-run where it was measured.
BEFORE_PROVENANCE = {
    "fanout-32core-400mbit.json": "the accelerator machine's 32-core host (device lane)",
    "fanout-32core-1000mbit.json": "the accelerator machine's 32-core host (device lane)",
}
FILES = sorted(path.name for path in RESULTS.glob("*.json"))
# Every run kept (x-history.jsonl), and the serving benchmark's deployments (each with its call's record).
HISTORIES = sorted(
    path.name for pattern in ("*-history.jsonl", "*-deployments.jsonl") for path in RESULTS.glob(pattern)
)


def assert_provenance(record: dict, where: str) -> None:
    assert set(record) >= KEYS, f"{where}: provenance lacks {sorted(KEYS - set(record))}"
    assert re.fullmatch(r"[0-9a-f]{7,40}", record["git_commit"]), (
        f"{where}: {record['git_commit']!r} names no commit"
    )
    assert record["cpu_cores"] >= 1 and record["command"], where
    for key in ("started_utc", "finished_utc"):
        stamp = datetime.datetime.fromisoformat(record[key].replace("Z", "+00:00"))
        assert stamp.utcoffset() == datetime.timedelta(0), f"{where}: {key} is not UTC"
    for key in ("load_avg_start", "load_avg_end"):
        assert set(record[key]) == {"1m", "5m", "15m"}, f"{where}: {key}"


@pytest.mark.parametrize("name", FILES)
def test_each_results_file_records_its_provenance(name: str) -> None:
    doc = json.loads((RESULTS / name).read_text())
    if name in BEFORE_PROVENANCE:
        assert "provenance" not in doc, f"{name} has a provenance now: take it off BEFORE_PROVENANCE"
        return
    assert "provenance" in doc, f"{name} has no provenance record (benchmarks/provenance.py)"
    assert_provenance(doc["provenance"], name)


@pytest.mark.parametrize("name", HISTORIES)
def test_each_kept_run_records_its_provenance_or_says_it_was_seeded(name: str) -> None:
    lines = (RESULTS / name).read_text().splitlines()
    for number, line in enumerate(lines, 1):
        run = json.loads(line)
        where = f"{name}:{number}"
        if "seeded_from" in run:  # a run recorded before runs were kept, copied in from git
            assert "provenance" not in run, where
            continue
        assert_provenance(run.get("provenance") or run.get("call") or {}, where)


def test_the_list_of_older_files_names_only_files_that_exist() -> None:
    assert set(BEFORE_PROVENANCE) <= set(FILES)
