"""Where a transport benchmark run lands: its results file, the history beside it, and its plot.

Every run is appended whole to a history beside the results file (x.json -> x-history.jsonl); the
results file is the latest run plus every kept run's headline figures, commit, time and load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from benchmarks.history import append_run, history_path, load_runs
from benchmarks.provenance import ROOT

RESULTS = ROOT / "benchmarks" / "results"

# Draws one results document into a .png: (doc, path).
Plot = Callable[[dict, Path], None]


def kept_run(run: dict, headline: tuple[str, ...]) -> dict:
    """One kept run's headline figures with its commit, time and load; a run seeded from git
    (recorded before provenance) says where it came from instead."""
    figures = {k: run.get(k) for k in headline}
    if "seeded_from" in run:
        return {"seeded_from": run["seeded_from"], "started_utc": run.get("started_utc"), **figures}
    prov = run["provenance"]
    return {
        "started_utc": prov["started_utc"],
        "git_commit": prov["git_commit"],
        "cpu_cores": prov["cpu_cores"],
        "load_avg_1m": [prov["load_avg_start"]["1m"], prov["load_avg_end"]["1m"]],
        **figures,
    }


def write(doc: dict, out: Path, headline: tuple[str, ...], plot: Plot | None = None) -> None:
    """Append the run to the history beside ``out`` (every run is kept), then write ``out``: this
    run, plus each kept run's headline figures; then its plot beside it, when one is given."""
    history = history_path(out)
    append_run(history, doc)
    doc["history"] = {"file": history.name, "runs": [kept_run(run, headline) for run in load_runs(history)]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    if plot is not None:
        draw(out, plot)


def draw(results: Path, plot: Plot) -> None:
    """Draw results.png beside a results file; without matplotlib, say how to later."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot; draw it elsewhere with `bench.py replot {results}`")
        return
    matplotlib.use("Agg")
    plot(json.loads(results.read_text()), results.with_suffix(".png"))
