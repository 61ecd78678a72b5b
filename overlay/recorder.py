"""The flight recorder: the last collectives of this process, dumped when something goes wrong.

A bounded buffer (rank, sequence, op, path, shape, dtype, duration) plus running counters,
written as one JSON file per process on a transport failure, on SIGUSR1 and at a clean exit
(vLLM may end its workers without one: send SIGUSR1 for a dump you can count on), so a hang
or a wrong answer can be traced to the collective that caused it.
"""

from __future__ import annotations

import atexit
import os
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from transport.integrity import write_json_atomic

DEFAULT_CAPACITY = 4096


class FlightRecorder:
    """Records collectives; ``dump`` writes ``overlay-flight-<pid>.json`` atomically."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, directory: str | None = None) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.counters: Counter[str] = Counter()
        self.seq = 0
        self.rank: int | None = None
        self.mode = "disabled"
        self.directory = Path(directory or tempfile.gettempdir())
        self._lock = threading.Lock()

    def record(self, op: str, path: str, shape: tuple[int, ...], dtype: str, seconds: float) -> None:
        with self._lock:
            self.seq += 1
            self.counters[f"{op}.{path}"] += 1
            self.entries.append(
                {
                    "rank": self.rank,
                    "seq": self.seq,
                    "op": op,
                    "path": path,
                    "shape": list(shape),
                    "dtype": dtype,
                    "duration_us": round(seconds * 1e6, 1),
                    "t": time.time(),
                }
            )

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def snapshot(self, reason: str) -> dict[str, Any]:
        with self._lock:
            return {
                "schema": "sparkring.overlay.flight/1",
                "pid": os.getpid(),
                "rank": self.rank,
                "mode": self.mode,
                "reason": reason,
                "collectives": self.seq,
                "counters": dict(self.counters),
                "entries": list(self.entries),
            }

    def dump(self, reason: str, always: bool = False) -> Path | None:
        """Write the snapshot; returns its path (None when nothing was recorded, unless ``always``)."""
        if not (always or self.seq or self.counters):
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"overlay-flight-{os.getpid()}.json"
        write_json_atomic(final, self.snapshot(reason), indent=None, sort_keys=False)
        return final

    def install_triggers(self) -> None:
        """Dump at exit and on SIGUSR1 (signal handlers only exist in the main thread)."""
        atexit.register(self.dump, "exit")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: self.dump("signal", always=True))


RECORDER = FlightRecorder(
    int(os.environ.get("SPARKRING_OVERLAY_RECORDER_SIZE", DEFAULT_CAPACITY)),
    os.environ.get("SPARKRING_OVERLAY_RECORDER_DIR"),
)
