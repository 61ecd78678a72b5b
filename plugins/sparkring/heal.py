"""The recovery agent: a small daemon on the controller that brings the attested deployment back.

It watches the ring through the status view (`playbooks/status.yml`, the same document a person
reads), and when a fault persists (a rank's container not running, rank 0's /health not 200, a
cable down) it relaunches with the project's own launch playbook and the attested profile, so a
relaunch is attested and gated like any launch and refuses a changed image or model. Attempts
follow a backoff (first within a minute, then growing) and stop at a cap, after which the agent
says so and exits. A cable that is down is never relaunched over: the attempt is refused naming
the cable; when a link caused the fault, the cable checks (`playbooks/qualify.yml`) run first.

Every fault and attempt is logged (`agent.log`), kept in `state.json` and counted in
`recovery.prom` (Prometheus text) in the state folder, which outlive the engine they describe.

    python -m sparkring.heal run CONFIG      # foreground
    python -m sparkring.heal start CONFIG    # detached, unless one already runs for this folder
    python -m sparkring.heal stop STATE_DIR  # SIGTERM, bounded; a relaunch in flight is ended too
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transport.integrity import write_json_atomic

SCHEMA = "sparkring.recovery/1"
# First try within a minute of the fault being confirmed, then growing; the cap is their count.
DELAYS_S = (20.0, 30.0, 120.0, 300.0)
# What in a stopped container's last words says a link, not the rank, failed.
LINK_WORDS = re.compile(r"cable|PeerTimeout|stopped answering|link", re.IGNORECASE)
# How the status view and the transport name a cable (`r1 cage1 <-> r2 cage1`).
CABLE_NAME = re.compile(r"r\d+ cage\d+ <-> r\d+ cage\d+")
log = logging.getLogger("sparkring.heal")


@dataclass
class Settings:
    """The agent's configuration (`agent.json`, written by the launch role)."""

    state_dir: Path
    probe: list[str]  # writes <state_dir>/status.json (the status document)
    cable_check: list[str]
    relaunch: list[str]
    cwd: str = "."
    interval_s: float = 15.0
    delays_s: tuple[float, ...] = DELAYS_S
    confirm: int = 2  # consecutive faulty probes before a fault counts
    stable_s: float = 600.0  # serving this long after a recovery resets the attempt count
    command_timeout_s: float = 1800.0
    manual: str = "ansible-playbook playbooks/launch.yml"  # what a person runs when the agent gives up

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Settings:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        raw["state_dir"] = Path(raw["state_dir"])
        for key in ("interval_s", "stable_s", "command_timeout_s"):
            if key in raw:
                raw[key] = float(raw[key])
        if "confirm" in raw:
            raw["confirm"] = int(raw["confirm"])
        raw["delays_s"] = tuple(float(d) for d in raw.get("delays_s", DELAYS_S))
        if not raw["delays_s"] or raw["delays_s"][0] > 60:
            raise ValueError(
                f"{path}: delays_s must be non-empty and start within 60 s, got {raw['delays_s']}"
            )
        return cls(**raw)


@dataclass
class Episode:
    """One fault, from its confirmation to the recovery (or the cap)."""

    cause: dict[str, Any]
    since: float
    since_utc: str
    link: bool
    next_at: float


@dataclass
class Healer:
    """The decision loop; commands run as real processes, the clock and sleep are injectable."""

    settings: Settings
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    state: str = "watching"
    message: str = ""
    attempt: int = 0
    suspect: int = 0
    episode: Episode | None = None
    recovered_at: float | None = None
    last_fault: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    links: dict[str, int] = field(default_factory=dict)  # faults per cable they named
    child: subprocess.Popen[str] | None = None
    stopping: bool = False

    # -- what the agent sees and does ----------------------------------------------------------
    def utc(self, offset_s: float = 0.0) -> str:
        return datetime.fromtimestamp(self.wall().timestamp() + offset_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def command(self, argv: list[str]) -> tuple[int, str]:
        """Run one command in its own process group (stop() ends the whole group); rc and output tail."""
        self.child = subprocess.Popen(
            argv,
            cwd=self.settings.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = self.child.communicate(timeout=self.settings.command_timeout_s)
            rc = self.child.returncode
        except subprocess.TimeoutExpired:
            os.killpg(self.child.pid, signal.SIGTERM)
            out, _ = self.child.communicate()
            rc, out = 124, (out or "") + f"\n(ended after {self.settings.command_timeout_s:.0f} s)"
        finally:
            self.child = None
        return rc, out or ""

    def probe(self) -> dict[str, Any] | None:
        """The status document, fresh; None when the probe could not run (seeing nothing is no fault)."""
        target = self.settings.state_dir / "status.json"
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        rc, out = self.command(self.settings.probe)
        try:
            return json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.warning("probe failed (exit %s): %s", rc, tail(out))
            return None

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> int:
        log.info(
            "watching (delays %s s, cap %d attempts)", self.settings.delays_s, len(self.settings.delays_s)
        )
        self.save()
        while not self.stopping:
            self.step(self.probe())
            if self.state == "gave_up":
                return 3
            if not self.stopping and self.state != "suspect":  # a suspected fault is looked at again at once
                self.sleep(self.settings.interval_s)
        self.state, self.message = "stopped", "stopped by request (playbooks/stop.yml)"
        self.save()
        return 0

    def step(self, doc: dict[str, Any] | None) -> None:
        """One probe's worth of decisions."""
        now = self.clock()
        if doc is None:
            self.save()
            return
        cause = doc.get("fault")
        if cause is None:
            self.suspect = 0
            if self.episode is not None:
                log.info("the ring serves again by itself (%s)", self.episode.cause["summary"])
                self.episode = None
            if (
                self.attempt
                and self.recovered_at is not None
                and now - self.recovered_at >= self.settings.stable_s
            ):
                self.attempt = 0
            self.state, self.message = "watching", ""
            self.save()
            return
        self.suspect += 1
        if self.episode is None:
            if self.suspect < self.settings.confirm:
                self.state, self.message = "suspect", cause["summary"]
                self.save()
                return
            self.begin(cause, now)
        elif cause["kind"] == "cable" and self.episode.cause["kind"] != "cable":
            self.episode.cause, self.episode.link = cause, True
        if now >= self.episode.next_at:
            self.recover(cause)
        self.save()

    def begin(self, cause: dict[str, Any], now: float) -> None:
        link = cause["kind"] == "cable" or bool(LINK_WORDS.search(cause["summary"]))
        self.episode = Episode(cause, now, self.utc(), link, now + self.delay())
        self.last_fault = {**cause, "time_utc": self.utc()}
        self.faults[cause["kind"]] = self.faults.get(cause["kind"], 0) + 1
        for cable in sorted(set(CABLE_NAME.findall(cause["summary"]))):
            self.links[cable] = self.links.get(cable, 0) + 1
        self.state, self.message = "backing_off", f"fault: {cause['summary']}"
        log.warning(
            "fault confirmed: %s; attempt %d in %.0f s", cause["summary"], self.attempt + 1, self.delay()
        )

    def delay(self) -> float:
        return self.settings.delays_s[min(self.attempt, len(self.settings.delays_s) - 1)]

    def recover(self, cause: dict[str, Any]) -> None:
        """One attempt: refuse over a down cable, run the cable checks after a link fault, relaunch."""
        assert self.episode is not None
        cap = len(self.settings.delays_s)
        if self.attempt >= cap:
            self.give_up()
            return
        self.attempt += 1
        started, record = (
            self.clock(),
            {"attempt": self.attempt, "time_utc": self.utc(), "cause": cause["summary"]},
        )
        if cause["kind"] == "cable":
            record.update(result="refused", detail=f"not relaunching over a down cable: {cause['summary']}")
        elif self.episode.link and (check := self.command(self.settings.cable_check))[0] != 0:
            record.update(result="refused", detail=f"the cable checks failed: {tail(check[1])}")
        else:
            rc, out = self.command(self.settings.relaunch)
            record.update(result="recovered" if rc == 0 else "failed", detail=tail(out))
        record["seconds"] = round(self.clock() - started, 1)
        if self.stopping:
            return  # ended by stop(): not an attempt that failed
        self.attempts.append(record)
        self.counts[record["result"]] = self.counts.get(record["result"], 0) + 1
        log.info("attempt %d of %d: %s (%s)", self.attempt, cap, record["result"], record["detail"][-300:])
        if record["result"] == "recovered":
            record["fault_to_serving_s"] = round(self.clock() - self.episode.since, 1)
            self.recovered_at, self.episode, self.suspect = self.clock(), None, 0
            self.state, self.message = "watching", f"recovered by attempt {self.attempt}"
        elif self.attempt >= cap:
            self.give_up()
        else:
            self.episode.next_at = self.clock() + self.delay()
            self.state = "backing_off"
            self.message = f"attempt {self.attempt} {record['result']}: {record['detail'][-300:]}"

    def give_up(self) -> None:
        self.state = "gave_up"
        self.message = (
            f"gave up after {self.attempt} attempts (the cap); last fault: "
            f"{self.last_fault['summary'] if self.last_fault else 'unknown'}. Fix it, then run {self.settings.manual}"
        )
        log.error(self.message)
        self.save()

    def stop(self, *_: object) -> None:
        """SIGTERM: end a command in flight (its whole process group) and leave the loop."""
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGTERM)

    # -- what it leaves behind ------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        cap = len(self.settings.delays_s)
        due = None
        if self.episode is not None and self.state == "backing_off":
            due = self.utc(max(0.0, self.episode.next_at - self.clock()))
        return {
            "schema": SCHEMA,
            "pid": os.getpid(),
            "running": self.state not in ("gave_up", "stopped"),
            "state": self.state,
            "message": self.message,
            "attempt": self.attempt,
            "max_attempts": cap,
            "delays_s": list(self.settings.delays_s),
            "next_attempt_utc": due,
            "fault_since_utc": self.episode.since_utc if self.episode else None,
            "last_fault": self.last_fault,
            "faults": self.faults,
            "link_faults": self.links,
            "counts": self.counts,
            "attempts": self.attempts[-50:],
            "updated_utc": self.utc(),
        }

    def save(self) -> None:
        doc = self.document()
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.settings.state_dir / "state.json", doc)
        prom = self.settings.state_dir / "recovery.prom"
        tmp = prom.with_suffix(".prom.tmp")
        tmp.write_text(prometheus(doc), encoding="utf-8")
        tmp.replace(prom)


def prometheus(doc: dict[str, Any]) -> str:
    """The agent's counters in Prometheus text (node_exporter's textfile collector reads such files)."""
    lines = [
        "# HELP sparkring:recovery_faults_total Faults the recovery agent confirmed, by kind (cable, rank, health)",
        "# TYPE sparkring:recovery_faults_total counter",
        *(f'sparkring:recovery_faults_total{{kind="{k}"}} {v}' for k, v in sorted(doc["faults"].items())),
        "# HELP sparkring:recovery_link_faults_total Faults that named a cable (down, or a peer that stopped answering on it)",
        "# TYPE sparkring:recovery_link_faults_total counter",
        *(
            f'sparkring:recovery_link_faults_total{{cable="{k}"}} {v}'
            for k, v in sorted(doc["link_faults"].items())
        ),
        "# HELP sparkring:recovery_attempts_total Recovery attempts by result (recovered, failed, refused)",
        "# TYPE sparkring:recovery_attempts_total counter",
        *(f'sparkring:recovery_attempts_total{{result="{k}"}} {v}' for k, v in sorted(doc["counts"].items())),
        "# HELP sparkring:recoveries_total Faults the agent recovered from (the ring served again)",
        "# TYPE sparkring:recoveries_total counter",
        f"sparkring:recoveries_total {doc['counts'].get('recovered', 0)}",
        "# HELP sparkring:recovery_gave_up 1 when the agent reached its cap and stopped",
        "# TYPE sparkring:recovery_gave_up gauge",
        f"sparkring:recovery_gave_up {int(doc['state'] == 'gave_up')}",
    ]
    return "\n".join(lines) + "\n"


def tail(text: str, lines: int = 6) -> str:
    """The last lines of a command's output, where Ansible says what failed."""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[-1500:]


# -- the daemon ----------------------------------------------------------------------------------
def pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if Path(f"/proc/{pid}").exists() else []
    return pid if b"sparkring.heal" in cmdline else None


def start(config: str) -> str:
    settings = Settings.load(config)
    pid_file = settings.state_dir / "agent.pid"
    if pid_alive(pid_file):
        return "running"
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "agent.log", "a", encoding="utf-8") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "sparkring.heal", "run", str(Path(config).resolve())],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            cwd=settings.cwd,
        )
    pid_file.write_text(f"{child.pid}\n")
    return "started"


def stop(state_dir: str, timeout_s: float = 60.0) -> str:
    pid_file = Path(state_dir) / "agent.pid"
    pid = pid_alive(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid_file):
        time.sleep(0.2)
    if pid_alive(pid_file):
        os.killpg(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    return "stopped"


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("run", "start", "stop"):
        print("usage: python -m sparkring.heal run|start CONFIG, or stop STATE_DIR", file=sys.stderr)
        return 2
    verb, target = argv
    if verb == "start":
        print(start(target))
        return 0
    if verb == "stop":
        print(stop(target))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    wake = threading.Event()
    healer = Healer(Settings.load(target), sleep=wake.wait)

    def on_signal(*_: object) -> None:
        healer.stop()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return healer.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
