"""The SparkCache benchmark keeps every run and takes its headline as the median of the runs kept."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from benchmarks.history import append_run, history_path, load_runs

ROOT = Path(__file__).resolve().parents[3]
KEPT = ROOT / "benchmarks" / "results" / "sparkcache-history.jsonl"


@pytest.fixture(scope="module")
def bench():
    from benchmarks.sparkcache import run

    return run


def a_run(ratio: float, code: dict | None) -> dict:
    run = copy.deepcopy(load_runs(KEPT)[-1])  # a real run's shape
    run.update(restore_ratio_vs_raw_read=ratio, code=code)
    run["disk"]["restore_ratio_vs_raw_read"] = ratio
    run.setdefault("provenance", {"started_utc": "2026-12-01T00:00:00+00:00", "git_commit": "0" * 40})
    return run


def test_runs_are_appended_never_replaced(tmp_path: Path) -> None:
    history = history_path(tmp_path / "sparkcache.json")
    assert history.name == "sparkcache-history.jsonl"
    append_run(history, {"n": 1})
    append_run(history, {"n": 2})
    assert load_runs(history) == [{"n": 1}, {"n": 2}]
    history.write_text(history.read_text() + "{not json\n")
    with pytest.raises(SystemExit, match=r"sparkcache-history.jsonl:3 is not one JSON run"):
        load_runs(history)


def test_the_headline_is_the_median_of_the_runs_of_this_code_not_the_last(bench, tmp_path: Path) -> None:
    code = {"trees": {"sparkcache": "a" * 40}, "dirty": False}
    older = {"trees": {"sparkcache": "b" * 40}, "dirty": False}
    runs = [a_run(0.2, older), a_run(0.9, code), a_run(0.8, code), a_run(0.6, code)]
    report = bench.headline(runs, runs[-1], tmp_path / "h.jsonl")
    assert report["restore_ratio_vs_raw_read"] == 0.8  # the last run said 0.6
    assert (report["runs_in_headline"], report["runs_in_history"]) == (3, 4)
    assert [row["in_headline"] for row in report["runs"]] == [False, True, True, True]
    bench.plot(report, runs, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0
