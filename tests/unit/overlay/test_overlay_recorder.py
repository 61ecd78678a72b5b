"""The flight recorder: bounded, complete records, dumped on failure and on SIGUSR1."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from overlay import collectives
from overlay.recorder import FlightRecorder
from transport import PeerClosedError

REPO = Path(__file__).resolve().parents[3]


def test_buffer_is_bounded_and_counters_are_not(tmp_path: Path) -> None:
    rec = FlightRecorder(capacity=3, directory=str(tmp_path))
    rec.rank = 2
    for i in range(5):
        rec.record("all_reduce", "ring", (1, 128 * i), "bfloat16", 1e-5 * (i + 1))
    dump = json.loads(rec.dump("test").read_text())
    assert dump["schema"] == "sparkring.overlay.flight/1" and dump["reason"] == "test"
    assert dump["collectives"] == 5 and dump["counters"] == {"all_reduce.ring": 5}
    assert [e["seq"] for e in dump["entries"]] == [3, 4, 5]
    last = dump["entries"][-1]
    assert (last["rank"], last["op"], last["path"], last["shape"], last["dtype"]) == (
        2,
        "all_reduce",
        "ring",
        [1, 512],
        "bfloat16",
    )
    assert last["duration_us"] == pytest.approx(50.0)


def test_nothing_recorded_writes_nothing_unless_asked(tmp_path: Path) -> None:
    rec = FlightRecorder(directory=str(tmp_path))
    assert rec.dump("exit") is None
    assert json.loads(rec.dump("signal", always=True).read_text())["collectives"] == 0


def test_a_transport_failure_dumps_the_recorder_and_propagates(tmp_path: Path, monkeypatch) -> None:
    rec = FlightRecorder(directory=str(tmp_path))
    monkeypatch.setattr(collectives, "RECORDER", rec)

    def dead_peer(x: torch.Tensor) -> torch.Tensor:
        raise PeerClosedError("all_reduce on rank 0: peer closed [peer rank 1]", 1, "all_reduce")

    with pytest.raises(PeerClosedError, match="peer rank 1"):
        collectives.run_ring("all_reduce", torch.ones(4), dead_peer)
    dump = json.loads((tmp_path / f"overlay-flight-{os.getpid()}.json").read_text())
    assert dump["reason"] == "all_reduce failed" and dump["counters"] == {"all_reduce.error": 1}


def test_sigusr1_dumps_a_running_process(tmp_path: Path) -> None:
    child = textwrap.dedent(
        """
        import sys, time
        from overlay.recorder import RECORDER
        RECORDER.install_triggers()
        RECORDER.record("all_gather", "ring", (4, 8), "float32", 0.001)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), SPARKRING_OVERLAY_RECORDER_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        path = tmp_path / f"overlay-flight-{proc.pid}.json"
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        dump = json.loads(path.read_text())
        assert dump["reason"] == "signal" and dump["entries"][0]["op"] == "all_gather"
        assert proc.poll() is None  # the signal dumps; it does not stop the process
    finally:
        proc.kill()
        proc.wait(30)
