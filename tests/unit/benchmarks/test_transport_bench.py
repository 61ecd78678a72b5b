"""`python -m benchmarks.transport.bench host`: SparkRing and gloo in the same ranks, written where --out says."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.provenance import ROOT

pytest.importorskip("torch")


def test_host_mode_writes_the_ratios_and_the_machine(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    cmd = [sys.executable, "-m", "benchmarks.transport.bench", "host", "--worlds", "2", "--rounds", "1"]
    cmd += ["--sizes", "16384,67108864", "--port", "29180", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    cells = doc["worlds"]["2"]["allreduce_fp32"]
    for size in ("16384", "67108864"):
        for impl in ("sparkring", "gloo"):
            assert cells[size][impl]["iterations"] >= 1 and cells[size][impl]["p50_us"] > 0
    big = cells["67108864"]
    assert doc["busbw_64m_ratio_vs_gloo_w2"] == round(
        big["sparkring"]["busbw_gbyte_s"] / big["gloo"]["busbw_gbyte_s"], 4
    )
    assert doc["p50_16k_ratio_vs_gloo_w2"] == cells["16384"]["p50_ratio_vs_gloo"]
    provenance = doc["provenance"]
    assert provenance["cpu_cores"] >= 1 and provenance["cpu_model"] and provenance["git_commit"]
    assert provenance["command"] == shlex.join([sys.executable, *cmd[1:]])  # the command as run, `-m` and all
    # Every run is kept: the history beside the results holds this one, whole.
    kept = [json.loads(line) for line in (tmp_path / "host-history.jsonl").read_text().splitlines()]
    assert [run["provenance"] for run in kept] == [provenance]
    assert doc["history"]["runs"][0]["busbw_64m_ratio_vs_gloo_w2"] == doc["busbw_64m_ratio_vs_gloo_w2"]
