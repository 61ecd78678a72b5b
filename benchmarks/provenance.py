"""What every benchmark results file records about the run that produced it.

A figure is only worth what anyone can tell about how it was made: the command line that ran,
the commit it ran on (and whether the tree had uncommitted changes), how many cores the
machine had, which CPU, how loaded it was, and when (UTC). Every script under benchmarks/ takes
``start = RunProvenance.capture()`` before it measures and writes ``start.finish()`` under the
``provenance`` key of its results; ``load_average()`` is the same reading for a single round.
Standard library only; a checkout without git is refused (a figure must name its commit).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def own_argv() -> list[str]:
    """This process's command line as it was typed: a benchmark runs as a module (`-m benchmarks.x.y`),
    and then sys.argv[0] is the module's file, which would not run again as a script."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return [*(["-m", spec.name] if spec is not None else sys.argv[:1]), *sys.argv[1:]]


def load_average() -> dict[str, float]:
    """The 1, 5 and 15 minute load averages, rounded (the run queue the benchmark shared the cores with)."""
    one, five, fifteen = os.getloadavg()
    return {"1m": round(one, 2), "5m": round(five, 2), "15m": round(fifteen, 2)}


def cpu_model() -> str:
    """The CPU's name: /proc/cpuinfo's "model name" (x86), else lscpu's "Model name" (it decodes
    ARM part numbers), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=False, env={**os.environ, "LC_ALL": "C"}
        ).stdout
    except FileNotFoundError:
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def utc_now() -> str:
    """The current UTC time, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def git_commit(root: Path = ROOT) -> tuple[str, bool]:
    """The checked-out commit and whether tracked files differ from it; refuses a tree without git.

    A copy of a checkout names its commit in SPARKRING_SOURCE_COMMIT (``<sha>``, or
    ``<sha>+dirty`` when the copy had uncommitted changes), which wins over any .git: the device
    lane's copy carries a .git that is not the commit the tree was copied from.
    """
    named = os.environ.get("SPARKRING_SOURCE_COMMIT")
    if named:
        sha, _, dirty = named.partition("+")
        return sha, dirty == "dirty"

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *argv], capture_output=True, text=True, check=False
            )
        except FileNotFoundError as error:
            raise SystemExit(
                f"git is not installed: a benchmark's results must name their commit ({error})"
            ) from None
        if done.returncode != 0:
            raise SystemExit(
                f"{root} is not a git checkout ({done.stderr.strip()}): run benchmarks from a clone so the "
                "results name their commit"
            )
        return done.stdout.strip()

    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))


@dataclasses.dataclass(frozen=True)
class RunProvenance:
    """The facts about a benchmark run, taken when it starts; ``finish`` adds the end of it."""

    command: str
    git_commit: str
    git_dirty: bool
    cpu_cores: int
    cpu_model: str
    started_utc: str
    load_avg_start: dict[str, float]

    @classmethod
    def capture(cls, argv: Sequence[str] | None = None) -> RunProvenance:
        """Read the facts now; ``argv`` defaults to this process's own (interpreter and script included)."""
        commit, dirty = git_commit()
        return cls(
            command=shlex.join([sys.executable, *(own_argv() if argv is None else argv)]),
            git_commit=commit,
            git_dirty=dirty,
            cpu_cores=os.cpu_count() or 0,
            cpu_model=cpu_model(),
            started_utc=utc_now(),
            load_avg_start=load_average(),
        )

    def finish(self) -> dict:
        """The record for the results file: the start facts plus the end time and the load at the end."""
        return {**dataclasses.asdict(self), "finished_utc": utc_now(), "load_avg_end": load_average()}
