"""The NCCL build shows progress: make's output goes to a log, and a progress file names the minutes
so far and the log's last line while it runs (the nccl role prints it per rank)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def test_make_output_is_logged_and_its_last_line_is_reported(nccl_utils, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(nccl_utils, "PROGRESS_INTERVAL_S", 0.05)
    script = (
        "import time\nfor i in range(3):\n    print(f'Compiling unit {i}', flush=True)\n    time.sleep(0.2)\n"
    )
    log, progress = tmp_path / "build.log", tmp_path / "progress.json"
    seen: list[str] = []
    real_write = nccl_utils.write_progress

    def spy(path, started, log_path, done):
        real_write(path, started, log_path, done)
        seen.append(json.loads(path.read_text())["phase"])

    monkeypatch.setattr(nccl_utils, "write_progress", spy)
    rc = nccl_utils.make_logged([sys.executable, "-c", script], tmp_path, log, progress)
    assert rc == 0
    assert log.read_text().splitlines() == [f"Compiling unit {i}" for i in range(3)]
    assert any(": Compiling unit " in phase and "(done)" not in phase for phase in seen)  # while it ran
    final = json.loads(progress.read_text())
    assert final["phase"].startswith("make 0 min ") and final["phase"].endswith("(done): Compiling unit 2")
    assert final["log"] == str(log)


def test_a_failed_make_reports_the_log_tail(nccl_utils, tmp_path: Path) -> None:
    log, progress = tmp_path / "build.log", tmp_path / "progress.json"
    script = "import sys\nprint('src/init.cc:12: error: boom', flush=True)\nsys.exit(2)\n"
    assert nccl_utils.make_logged([sys.executable, "-c", script], tmp_path, log, progress) == 2
    assert nccl_utils.log_tail(log, 3000).endswith("error: boom")
