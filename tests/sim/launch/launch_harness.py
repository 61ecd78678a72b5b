"""What the sim launch tests share: the ranks' own Docker daemons, rank 0's API through the
controller namespace (its completions and its /metrics), the project's playbooks run with the test
secrets, and the overlay's flight recorders and SparkCache's snapshots read off the ranks' private
directories.

Every call is bounded; nothing here starts or stops a deployment by itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SIM_RANKS = Path("/var/lib/sparkring-sim/ranks")
RANKS = ("r0", "r1", "r2", "r3")
SECRETS = {"HF_TOKEN": "hf_sparkring_test_7f3a9c", "VLLM_API_KEY": "sk-sparkring-test-51d2e8"}
HEAD_API = "http://198.19.254.10:8000"
SIM_PROFILE = ROOT / "inventories" / "sim" / "launch.env"
# The cable and burn faults are tests/sim/cable's subject: the launch tests' site.yml runs (the
# ring's and the pair's) qualify every cable with few round trips.
LEAN_QUALIFY = {"qualify_iterations": 100, "qualify_burn_iterations": [20, 1]}


def docker(host: str, *args: str, ranks: Path = SIM_RANKS) -> subprocess.CompletedProcess[str]:
    """The rank's own daemon, through its socket in the rank's private /run (under `ranks`)."""
    socket = ranks / host / "run" / "docker.sock"
    return subprocess.run(
        ["docker", "-H", f"unix://{socket}", *args], capture_output=True, text=True, timeout=120, check=False
    )


def docker_build(host: str, tag: str, containerfile: str) -> subprocess.CompletedProcess[str]:
    """Build a context-free image (the Containerfile on stdin) on the rank's own daemon."""
    socket = SIM_RANKS / host / "run" / "docker.sock"
    return subprocess.run(
        ["docker", "-H", f"unix://{socket}", "build", "--quiet", "--network", "none", "--tag", tag, "-"],
        input=containerfile,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def container_ids() -> dict[str, str]:
    return {
        host: docker(
            host, "container", "inspect", "--format", "{{.Id}}", f"sparkring-rank{host[1:]}"
        ).stdout.strip()
        for host in RANKS
    }


def container_log(host: str, since: float | None = None) -> str:
    """The rank's container log, whole or from `since` (a Unix time) on."""
    window = ["--since", f"{since:.3f}"] if since is not None else []
    logs = docker(host, "logs", *window, f"sparkring-rank{host[1:]}")
    return logs.stdout + logs.stderr


def ask(path: str, body: dict | None = None, api: str = HEAD_API, netns: str = "sr-ctl") -> tuple[int, str]:
    """(HTTP status, body) of one request to rank 0's API from the controller namespace (as
    docs/launch.md says); status 0 when nothing answered. A fault's error is an answer: nothing
    is asserted here."""
    argv = [
        "ip",
        "netns",
        "exec",
        netns,
        "curl",
        "-sS",
        "--max-time",
        "120",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
    ]
    argv += [f"{api}{path}", "-H", f"Authorization: Bearer {SECRETS['VLLM_API_KEY']}"]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    text, _, code = done.stdout.rpartition("\n")
    return (int(code) if code.strip().isdigit() else 0), text


def complete(
    prompt: str | list[int] = "The ring of four",
    max_tokens: int = 8,
    api: str = HEAD_API,
    netns: str = "sr-ctl",
) -> dict:
    """One greedy completion through rank 0's API."""
    body = {"model": "sim-tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    code, text = ask("/v1/completions", body, api, netns)
    assert code == 200, f"{api}/v1/completions answered {code}: {text[:1000]}"
    return json.loads(text)


def profile_variant(directory: Path, **overrides: str) -> Path:
    """The sim launch profile with some keys changed (a user's edited launch.env)."""
    lines = []
    for line in SIM_PROFILE.read_text().splitlines():
        key = line.partition("=")[0]
        lines.append(f"{key}={overrides.pop(key)}" if key in overrides else line)
    lines += [f"{key}={value}" for key, value in overrides.items()]
    path = directory / "launch.env"
    path.write_text("\n".join(lines) + "\n")
    return path


class Launches:
    """Runs the project's playbooks with the secrets in their environment, keeping every output."""

    def __init__(self, run) -> None:
        self.run = run
        self.outputs: list[str] = []

    def playbook(self, name: str, *extra: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
        """playbooks/<name>, or a playbook path from the project root (site.yml, a molecule
        scenario's verify)."""
        os.environ.update(SECRETS)
        try:
            path = f"playbooks/{name}" if (ROOT / "playbooks" / name).is_file() else name
            done = self.run(["ansible-playbook", "-v", path, *extra], timeout=timeout)
        finally:
            for key in SECRETS:
                os.environ.pop(key, None)
        self.outputs.append(done.stdout + done.stderr)
        return done


def worker_pids() -> dict[str, int]:
    """Each rank's vLLM worker (the process that runs the collectives) as a host PID.

    `docker top` answers in host PIDs; the worker's title replaces its argv (and its environ),
    so the rank comes from whose container it runs in."""
    found: dict[str, int] = {}
    for host in RANKS:
        top = docker(host, "top", f"sparkring-rank{host[1:]}", "-eo", "pid,args").stdout.splitlines()
        workers = [int(line.split()[0]) for line in top[1:] if "VLLM::Worker" in line]
        if len(workers) == 1:
            found[host] = workers[0]
    return found


def dump_flight_recorders(timeout_s: float = 60) -> dict[str, dict]:
    """SIGUSR1 every rank's worker and read the dumps it writes into the rank's recorder mount."""
    pids = worker_pids()
    assert sorted(pids) == list(RANKS), f"vLLM workers found: {pids}"
    sent = time.time()
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dumps = {}
        for host in RANKS:
            for path in (SIM_RANKS / host / "var-lib-sparkring" / "overlay").glob("overlay-flight-*.json"):
                if path.stat().st_mtime >= sent - 1:
                    dump = json.loads(path.read_text())
                    if dump["reason"] == "signal":
                        dumps[host] = dump
        if len(dumps) == len(RANKS):
            return dumps
        time.sleep(0.5)
    raise TimeoutError(f"the workers {pids} did not all dump their flight recorder in {timeout_s}s")


def snapshots(host: str) -> list[Path]:
    """The SparkCache snapshots the rank has published (its store outlives deployments)."""
    return sorted((SIM_RANKS / host / "var-lib-sparkring" / "sparkcache").glob("id-*/snapshots/*.json"))


def wait_for_snapshots(before: dict[str, int], timeout_s: float = 120) -> dict[str, int]:
    """SparkCache publishes after the request finishes: wait (bounded) until every rank has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = {host: len(snapshots(host)) for host in RANKS}
        if all(now[host] > before[host] for host in RANKS):
            return now
        time.sleep(1)
    raise TimeoutError(f"SparkCache snapshots per rank stayed {before} for {timeout_s}s")


SERIES = re.compile(r"^(sparkring:\w+)\{([^}]*)\} (\S+)$", re.M)


def metrics() -> dict[tuple[str, frozenset], float]:
    """Rank 0's /metrics (vLLM's own endpoint), the sparkring:* series by name and labels."""
    done = subprocess.run(
        ["ip", "netns", "exec", "sr-ctl", "curl", "-sS", "--max-time", "30", f"{HEAD_API}/metrics"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {
        (name, frozenset(re.findall(r'(\w+)="([^"]*)"', labels))): float(value)
        for name, labels, value in SERIES.findall(done.stdout)
    }


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    """How far the series of `name` matching `labels` moved (summed over their other labels)."""
    want = set(labels.items())

    def total(scrape: dict) -> float:
        return sum(v for (n, ls), v in scrape.items() if n == name and want <= ls)

    return total(after) - total(before)
