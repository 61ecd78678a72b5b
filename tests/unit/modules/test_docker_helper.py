"""module_utils/sparkring_docker.py, the one way modules reach Docker, against a stand-in docker CLI.

This machine's root namespace runs no Docker daemon (the sim ring's ranks each run their own), so
the CLI is a script that answers as docker does for the few calls the helper makes; the helper's
code and AnsibleModule's run_command run unchanged. The flight recorder module is then run whole
against a real worker process that the stand-in's `docker top` lists.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils import sparkring_docker
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from tests.project_code import load_library_module

ROOT = Path(__file__).resolve().parents[3]

STAND_IN = r"""#!/bin/sh
echo "$DOCKER_HOST $*" >> "$CALLS"
case "$1 $2" in
  "container inspect") [ "$3" = web ] && echo '[{"Id": "c0ffee", "State": {"Running": true}}]' && exit 0
                       [ "$3" = down ] && echo "Cannot connect to the Docker daemon" >&2 && exit 1
                       echo "Error: No such container: $3" >&2; exit 1;;
  "top web") printf 'PID\n%s\n' "$WORKER_PID"; exit 0;;
  "version --format") echo 27.5.1; exit 0;;
esac
exit 2
"""


@pytest.fixture
def docker_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(STAND_IN)
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    return tmp_path / "calls"


def helper(docker_host: str = "unix:///run/rank2/docker.sock") -> sparkring_docker.Docker:
    with patch_module_args({"docker_host": docker_host}):
        module = AnsibleModule(argument_spec=dict(sparkring_docker.DOCKER_HOST_OPTION))
    return sparkring_docker.Docker(module)


def test_inspect_tells_a_missing_object_from_a_daemon_that_does_not_answer(docker_cli: Path) -> None:
    docker = helper()
    assert docker.inspect("web") == {"Id": "c0ffee", "State": {"Running": True}}
    assert docker.inspect("absent") is None
    with pytest.raises(sparkring_docker.DockerError, match="Cannot connect to the Docker daemon"):
        docker.inspect("down")
    assert docker.ping() == "27.5.1"
    # every call went to the rank's daemon named by docker_host
    assert all(
        line.startswith("unix:///run/rank2/docker.sock ") for line in docker_cli.read_text().splitlines()
    )


def test_an_empty_docker_host_leaves_the_default_socket(docker_cli: Path, monkeypatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    helper("").ping()
    assert docker_cli.read_text() == " version --format {{.Server.Version}}\n"


WORKER = r"""
import json, os, signal, sys, time
def dump(*_):
    path = os.path.join(sys.argv[1], f"overlay-flight-{os.getpid()}.json")
    with open(path, "w") as handle:
        json.dump({"reason": "signal", "rank": 2, "mode": "custom", "collectives": 7}, handle)
signal.signal(signal.SIGUSR1, dump)
print("ready", flush=True)
time.sleep(60)
"""


def test_the_flight_recorder_signals_the_container_workers_docker_lists(
    docker_cli: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    script = tmp_path / "worker.py"  # a short command line: the module reads its first 400 bytes
    script.write_text(WORKER)
    worker = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), "VLLM::Worker"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout.readline() == "ready\n"
        monkeypatch.setenv("WORKER_PID", str(worker.pid))
        spec = {"container": "web", "recorder_dir": str(tmp_path), "timeout_s": 20}
        recorder = load_library_module("sparkring_flight_recorder")
        with patch_module_args(spec), pytest.raises(SystemExit):
            recorder.main()
        result = json.loads(capsys.readouterr().out)
        assert result.get("failed") is None and not result["note"], result
        assert [(d["pid"], d["rank"], d["collectives"]) for d in result["dumps"]] == [(worker.pid, 2, 7)]
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=10)
