"""The recovery agent (plugins/sparkring/heal.py): backoff, cap, refusal over a down cable, the cable
checks after a link fault, and start/stop of the daemon. Its probe, cable check and relaunch are
real processes (small scripts standing in for the playbooks: the probe copies a status document
the test writes, the relaunch makes the ring serve again or fails); the clock is virtual, so the
backoff is checked by the times the agent chose, never by waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sparkring import heal
from sparkring.status import build_status

ROOT = Path(__file__).resolve().parents[3]
CABLE = "r1 cage1 <-> r2 cage0"


def rank(n: int, state: str = "running", last_error: str = "", port_up: bool = True) -> dict:
    ports = [
        {
            "interface": "ring0",
            "peer_rank": (n + 3) % 4,
            "cage": 0,
            "peer_cage": 1,
            "operstate": "up",
            "carrier": True,
        },
        {
            "interface": "ring1",
            "peer_rank": (n + 1) % 4,
            "cage": 1,
            "peer_cage": 0,
            "operstate": "up" if port_up else "down",
            "carrier": port_up,
        },
    ]
    return {
        "rank": n,
        "host": f"r{n}",
        "container": {
            "name": f"sparkring-rank{n}",
            "state": state,
            "exit_code": 0 if state == "running" else 137,
            "last_error": last_error,
        },
        "attestation": {
            "image_id": "sha256:abc",
            "models": {"/models/model": "d" * 64},
            "profile_sha256": "p",
        },
        "ports": ports,
        "health": {"url": "http://127.0.0.1:8000/health", "status": 200, "error": ""} if n == 0 else {},
    }


def doc(*ranks: dict, health: int | None = 200) -> dict:
    if health != 200:
        ranks[0]["health"]["status"] = health
    return build_status(list(ranks), "inventories/sim", "sim", "2026-12-06T20:00:00Z")


def serving() -> dict:
    return doc(*(rank(n) for n in range(4)))


def rank2_killed() -> dict:
    return doc(rank(0), rank(1), rank(2, "exited"), rank(3), health=503)


def cable_down() -> dict:
    return doc(rank(0), rank(1, port_up=False), rank(2), rank(3), health=503)


def link_fault_cable_up() -> dict:
    said = f"rank 2 (198.19.1.2, {CABLE}) stopped answering at 20:00:01"
    return doc(rank(0, "exited", said), rank(1), rank(2), rank(3), health=None)


class Clock:
    """Virtual time: sleeping advances it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


SCRIPT = r"""
import json, pathlib, sys
here = pathlib.Path(sys.argv[1])
with open(here / "calls.log", "a") as log:
    log.write(sys.argv[2] + "\n")
rc = int((here / f"{sys.argv[2]}.rc").read_text()) if (here / f"{sys.argv[2]}.rc").exists() else 0
if sys.argv[2] == "relaunch" and rc == 0:
    (here / "scenario.json").write_text((here / "serving.json").read_text())
sys.exit(rc)
"""


@pytest.fixture
def ring(tmp_path: Path):
    """A scenario folder: what the probe sees, what each command answers, what ran."""
    (tmp_path / "act.py").write_text(SCRIPT)
    (tmp_path / "serving.json").write_text(json.dumps(serving()))
    state = tmp_path / "state"

    def make(scenario: dict, interval_s: float = 15.0, **overrides) -> tuple[heal.Healer, Clock]:
        (tmp_path / "scenario.json").write_text(json.dumps(scenario))
        settings = heal.Settings(
            state_dir=state,
            probe=["cp", str(tmp_path / "scenario.json"), str(state / "status.json")],
            cable_check=[sys.executable, str(tmp_path / "act.py"), str(tmp_path), "cable_check"],
            relaunch=[sys.executable, str(tmp_path / "act.py"), str(tmp_path), "relaunch"],
            interval_s=interval_s,
            manual="ansible-playbook -i inventories/sim playbooks/launch.yml",
            **overrides,
        )
        clock = Clock()
        return heal.Healer(settings, clock=clock, sleep=clock.sleep), clock

    make.dir = tmp_path
    return make


def calls(folder: Path) -> list[str]:
    path = folder / "calls.log"
    return path.read_text().split() if path.exists() else []


def steps(healer: heal.Healer, clock: Clock, n: int) -> None:
    for _ in range(n):
        healer.step(healer.probe())
        clock.sleep(healer.settings.interval_s)


def test_a_killed_rank_is_relaunched_within_a_minute_and_counted(ring) -> None:
    healer, clock = ring(rank2_killed())
    healer.step(healer.probe())
    assert healer.state == "suspect" and calls(ring.dir) == []  # one probe is not a fault yet
    t0 = clock()
    steps(healer, clock, 4)
    assert calls(ring.dir) == ["relaunch"]
    attempt = healer.attempts[0]
    assert attempt["result"] == "recovered" and "rank 2 container exited (exit 137)" in attempt["cause"]
    assert healer.state == "watching" and healer.faults == {"rank": 1} and healer.counts == {"recovered": 1}
    assert clock() - t0 <= 60  # confirmed at the second probe, relaunched after the first delay
    state = json.loads((ring.dir / "state" / "state.json").read_text())
    assert state["counts"] == {"recovered": 1} and state["last_fault"]["kind"] == "rank"
    prom = (ring.dir / "state" / "recovery.prom").read_text()
    assert "sparkring:recoveries_total 1" in prom and 'sparkring:recovery_faults_total{kind="rank"} 1' in prom
    steps(healer, clock, 3)
    assert calls(ring.dir) == ["relaunch"]  # serving: nothing more happens


def test_failed_relaunches_back_off_and_stop_at_the_cap(ring) -> None:
    healer, clock = ring(rank2_killed(), interval_s=5.0)
    (ring.dir / "relaunch.rc").write_text("2")
    tried: list[float] = []
    confirmed = None
    for _ in range(400):
        before = len(calls(ring.dir))
        healer.step(healer.probe())
        if confirmed is None and healer.episode is not None:
            confirmed = clock()
        if len(calls(ring.dir)) > before:
            tried.append(clock() - confirmed)
        if healer.state == "gave_up":
            break
        clock.sleep(5.0)
    assert calls(ring.dir) == ["relaunch"] * 4
    gaps = [b - a for a, b in zip([0.0, *tried], tried, strict=False)]
    assert [round(g) for g in gaps] == [20, 30, 120, 300]  # each attempt after its delay, probe by probe
    assert healer.counts == {"failed": 4}
    assert "gave up after 4 attempts" in healer.message
    assert "ansible-playbook -i inventories/sim playbooks/launch.yml" in healer.message
    assert "sparkring:recovery_gave_up 1" in (ring.dir / "state" / "recovery.prom").read_text()


def test_the_agent_gives_up_by_exiting_and_says_so(ring) -> None:
    healer, _clock = ring(rank2_killed(), interval_s=5.0)
    (ring.dir / "relaunch.rc").write_text("1")
    assert healer.run() == 3
    state = json.loads((ring.dir / "state" / "state.json").read_text())
    assert state["state"] == "gave_up" and not state["running"] and state["attempt"] == 4


def test_a_down_cable_is_never_relaunched_over_and_is_named(ring) -> None:
    healer, clock = ring(cable_down())
    steps(healer, clock, 4)
    assert calls(ring.dir) == []  # neither the relaunch nor the cable checks ran over a down cable
    refused = healer.attempts[0]
    assert refused["result"] == "refused"
    assert f"cable {CABLE} is down at r1 ring1 (down)" in refused["detail"]
    assert healer.state == "backing_off" and healer.counts == {"refused": 1}
    assert healer.links == {CABLE: 1}  # counted per cable, where it outlives the engine
    prom = (ring.dir / "state" / "recovery.prom").read_text()
    assert f'sparkring:recovery_link_faults_total{{cable="{CABLE}"}} 1' in prom
    # The cable comes back; the engine is still down: the cable checks run first, then the relaunch.
    (ring.dir / "scenario.json").write_text(json.dumps(rank2_killed()))
    steps(healer, clock, 4)
    assert calls(ring.dir) == ["cable_check", "relaunch"]
    assert healer.attempts[-1]["result"] == "recovered" and healer.counts == {"refused": 1, "recovered": 1}


def test_a_link_fault_runs_the_cable_checks_first_and_refuses_when_they_fail(ring) -> None:
    healer, clock = ring(link_fault_cable_up())
    (ring.dir / "cable_check.rc").write_text("2")
    steps(healer, clock, 4)
    assert calls(ring.dir) == ["cable_check"]
    assert (
        healer.attempts[0]["result"] == "refused"
        and "the cable checks failed" in healer.attempts[0]["detail"]
    )
    (ring.dir / "cable_check.rc").write_text("0")
    steps(healer, clock, 4)
    assert calls(ring.dir) == ["cable_check", "cable_check", "relaunch"]
    assert healer.attempts[-1]["result"] == "recovered"


def test_a_ring_that_serves_again_by_itself_ends_the_episode(ring) -> None:
    healer, clock = ring(rank2_killed())
    steps(healer, clock, 1)
    (ring.dir / "scenario.json").write_text(json.dumps(serving()))
    steps(healer, clock, 5)
    assert calls(ring.dir) == [] and healer.state == "watching" and healer.episode is None


def test_a_probe_that_cannot_run_is_not_a_fault(ring) -> None:
    healer, clock = ring(rank2_killed())
    healer.settings.probe = [sys.executable, "-c", "import sys; sys.exit(4)"]
    steps(healer, clock, 6)
    assert calls(ring.dir) == [] and healer.episode is None


def test_settings_refuse_a_first_delay_over_a_minute_and_unknown_keys(tmp_path: Path) -> None:
    base = {"state_dir": str(tmp_path), "probe": ["true"], "cable_check": ["true"], "relaunch": ["true"]}
    (tmp_path / "a.json").write_text(json.dumps({**base, "delays_s": [90, 120]}))
    with pytest.raises(ValueError, match="start within 60 s"):
        heal.Settings.load(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({**base, "retries": 3}))
    with pytest.raises(ValueError, match="unknown keys"):
        heal.Settings.load(tmp_path / "b.json")


def test_start_runs_one_daemon_and_stop_ends_it_and_its_relaunch(tmp_path: Path) -> None:
    """The real daemon (`python -m sparkring.heal`): start twice gives one process; stop ends it
    while its relaunch (a long sleep) is in flight, and the state says stopped."""
    state = tmp_path / "state"
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps(rank2_killed()))
    marker = tmp_path / "relaunch.pid"
    config = tmp_path / "agent.json"
    config.write_text(
        json.dumps(
            {
                "state_dir": str(state),
                "probe": ["cp", str(scenario), str(state / "status.json")],
                "cable_check": ["true"],
                "relaunch": ["sh", "-c", f"echo $$ > {marker}; exec sleep 600"],
                "interval_s": 0.2,
                "delays_s": [0.1],
                "confirm": 1,
                "cwd": str(ROOT),
            }
        )
    )
    env_run = [sys.executable, "-m", "sparkring.heal"]
    assert (
        subprocess.run([*env_run, "start", str(config)], capture_output=True, text=True, check=True).stdout
        == "started\n"
    )
    assert (
        subprocess.run([*env_run, "start", str(config)], capture_output=True, text=True, check=True).stdout
        == "running\n"
    )
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    relaunch_pid = int(marker.read_text())
    assert (
        subprocess.run([*env_run, "stop", str(state)], capture_output=True, text=True, check=True).stdout
        == "stopped\n"
    )
    assert (
        not Path(f"/proc/{relaunch_pid}").exists()
        or "zombie" in Path(f"/proc/{relaunch_pid}/status").read_text().lower()
    )
    assert json.loads((state / "state.json").read_text())["state"] == "stopped"
    assert not (state / "agent.pid").exists()
    assert (
        subprocess.run([*env_run, "stop", str(state)], capture_output=True, text=True, check=True).stdout
        == "not running\n"
    )
