"""A dead ring peer stops this vLLM node now, with a status and a record that say why.

vLLM only notices a remote worker that stopped answering when its own RPC times out (300 s), and a
headless node never notices at all. So each worker watches its ring communicators' verdicts
(transport.liveness: heartbeats, the dead-peer bound, the verdict passed around the ring): on the
first one it writes the fault record, logs the named error and leaves with ``EXIT_PEER_DEAD``.
On rank 0 vLLM's executor sees its worker die and marks the engine dead (``/health`` 503); on a
headless node the node's process ends. The container's entrypoint turns the record into its own
exit status and last log line (images/entrypoint.py), and the endpoint plugin into the error
every request gets (overlay/endpoint.py).

The record is one JSON file at ``SPARKRING_FAULT_PATH`` (the entrypoint sets it for vLLM; else
``$SPARKRING_OVERLAY_RECORDER_DIR`` or ``$TMPDIR``, ``sparkring-fault.json``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_PEER_DEAD = 69  # EX_UNAVAILABLE: a ring peer (rank or cable) stopped answering
WATCH_INTERVAL_S = 0.2
SCHEMA = "sparkring.fault/1"


def fault_path() -> Path:
    explicit = os.environ.get("SPARKRING_FAULT_PATH")
    if explicit:
        return Path(explicit)
    folder = os.environ.get("SPARKRING_OVERLAY_RECORDER_DIR") or tempfile.gettempdir()
    return Path(folder) / "sparkring-fault.json"


def read_fault(path: Path | None = None) -> dict[str, Any] | None:
    """The fault record, or None when there is none (or it is unreadable: it is written atomically)."""
    try:
        record = json.loads((path or fault_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def write_fault(record: dict[str, Any], path: Path | None = None) -> Path:
    from transport.integrity import write_json_atomic

    path = path or fault_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"schema": SCHEMA, **record}, indent=None, sort_keys=False)
    return path


def stop_for(group: str, rank: int, verdict: Any, exit: Callable[[int], Any] = os._exit) -> None:
    """Record the verdict, say it on stderr and end this process with EXIT_PEER_DEAD."""
    from overlay.recorder import RECORDER

    message = verdict.describe()
    write_fault(
        {
            "rank": rank,
            "group": group,
            "dead_rank": verdict.dead_rank,
            "cable": verdict.cable,
            "address": verdict.address,
            "closed": verdict.closed,
            "reported_by": verdict.reporter,
            "at": verdict.at.isoformat(),
            "message": message,
            "exit_status": EXIT_PEER_DEAD,
            "pid": os.getpid(),
        }
    )
    RECORDER.dump(f"peer dead: {message}", always=True)
    sys.stderr.write(
        f"sparkring overlay: the ring failed on rank {rank} ({group}): {message}; "
        f"stopping this vLLM process (exit {EXIT_PEER_DEAD}) so the engine fails now\n"
    )
    sys.stderr.flush()
    exit(EXIT_PEER_DEAD)


class Watch:
    """One daemon thread per process: polls every communicator's verdict, stops on the first."""

    def __init__(self, comms: Callable[[], dict[str, Any]], rank: Callable[[], int | None]) -> None:
        self._comms, self._rank = comms, rank
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sparkring-ring-watch", daemon=True)
                self._thread.start()

    def check(self) -> tuple[str, Any] | None:
        """The first group with a verdict, if any."""
        for name, comm in self._comms().items():
            verdict = comm.verdict()
            if verdict is not None:
                return name, verdict
        return None

    def stop_if_dead(self) -> None:
        """Stop this process now if the ring has a verdict. Also called when a collective fails:
        the engine settles the verdict before it returns, and a worker that raised instead would
        end vLLM with no record, its error naming no rank."""
        found = self.check()
        if found is not None:
            name, verdict = found
            rank = self._rank()
            stop_for(name, rank if rank is not None else -1, verdict)

    def _run(self) -> None:
        while True:
            self.stop_if_dead()
            time.sleep(WATCH_INTERVAL_S)
