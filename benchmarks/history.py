"""Every run of a benchmark kept: one JSON line per run in a history file beside its results.

A headline taken from the last run that passed hides the runs that did not; one taken as the
median of every run kept shows what the code does on this machine from run to run. Each line
is one run's full results (with its provenance); a line is only ever appended, never rewritten.
``source_trees`` names the code a run measured (git tree hashes), so a headline can take the
runs of the code it describes and leave older code's runs in the file without counting them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from benchmarks.provenance import ROOT


def history_path(results: Path) -> Path:
    """The history kept beside a results file: ``x.json`` -> ``x-history.jsonl``."""
    return results.with_name(f"{results.stem}-history.jsonl")


def append_run(history: Path, run: dict) -> None:
    """Append one run as one line, flushed to disk before returning."""
    history.parent.mkdir(parents=True, exist_ok=True)
    with history.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(run, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def load_runs(history: Path) -> list[dict]:
    """Every run in the file, oldest first; a line that does not parse is an error naming it."""
    if not history.exists():
        return []
    runs = []
    for number, line in enumerate(history.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise SystemExit(
                    f"{history}:{number} is not one JSON run ({error}): fix or remove that line"
                ) from None
    return runs


def source_trees(paths: Iterable[str], root: Path = ROOT) -> dict[str, str]:
    """The git tree hash of each path (a file or folder): what a run measured.

    Read from HEAD in a checkout; in a copy that names its commit in SPARKRING_SOURCE_COMMIT (the
    device lane's, whose .git is not the commit the files came from) hashed from the files
    themselves, through a throwaway index, so that the hashes are the ones HEAD would give for
    the same files."""
    if os.environ.get("SPARKRING_SOURCE_COMMIT"):
        return {path: _working_tree_hash(root, path) for path in paths}
    trees = {}
    for path in paths:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", f"HEAD:{path}"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"{path} is not in the checked-out commit: {done.stderr.strip()}")
        trees[path] = done.stdout.strip()
    return trees


def _working_tree_hash(root: Path, path: str) -> str:
    """The blob (a file) or tree (a folder) hash git would record for `path` as it is on disk."""
    if not (root / path).exists():
        raise SystemExit(f"{path} is not in this copy of the checkout ({root})")
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(scratch) / "index"))

        def git(*argv: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(root), *argv], capture_output=True, text=True, env=env, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"hashing {path} in {root}: git {argv[0]}: {done.stderr.strip()}")
            return done.stdout.strip()

        if (root / path).is_file():
            return git("hash-object", "--", path)
        git("add", "--all", "--", path)
        return git("write-tree", f"--prefix={path.rstrip('/')}/")


def median_of(runs: list[dict], key: str) -> float:
    """The median of one top-level figure over runs (the headline)."""
    if not runs:
        raise ValueError(f"no runs to take the median of {key} from")
    return statistics.median(run[key] for run in runs)
