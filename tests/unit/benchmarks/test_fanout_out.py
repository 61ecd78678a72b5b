"""`python -m benchmarks.fanout.run` writes the results it is told to (--out), never a fixed name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.fanout.run", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_the_results_file_must_be_named() -> None:
    # --replot keeps this from ever starting a measurement, whatever the script does with it.
    done = run("--replot")
    assert done.returncode == 2 and "the following arguments are required: --out" in done.stderr


def test_replot_draws_beside_the_file_it_is_told(tmp_path: Path) -> None:
    out = tmp_path / "lane" / "fanout-test.json"
    out.parent.mkdir()
    shutil.copyfile(ROOT / "benchmarks" / "results" / "fanout-32core-400mbit.json", out)
    done = run("--out", str(out), "--replot")
    assert done.returncode == 0, done.stderr
    assert out.with_suffix(".png").stat().st_size > 0
    assert json.loads(out.read_text())["ratio_vs_single_link"]  # the JSON is read, not rewritten
    assert sorted(p.name for p in out.parent.iterdir()) == ["fanout-test.json", "fanout-test.png"]


def test_the_benchmark_loads_the_fan_out_code_it_measures() -> None:
    # The agent's module_utils import their siblings; the benchmark must resolve them as the agent does.
    probe = "from benchmarks.fanout import run; fan = run.load_fanout(); print(fan.build_manifest.__module__)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "sparkring_fanout_manifest", done.stderr
