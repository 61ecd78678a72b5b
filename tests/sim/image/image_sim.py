"""Helpers for the image sim tests: each rank's Docker and files as seen from the host, and runs
of the fan-out play the way a user runs a playbook."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RANKS = ("r0", "r1", "r2", "r3")
SIM_RANKS = Path("/var/lib/sparkring-sim/ranks")
TEST_DEST = "/var/lib/sparkring/images-test"
TEST_PORT = 29611
PLAYBOOK = Path(__file__).with_name("fanout.yml")


def env() -> dict[str, str]:
    values = dict(os.environ)
    values["PATH"] = f"{ROOT / '.venv' / 'bin'}:{values.get('PATH', '')}"
    values.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return values


def run(argv: list[str], timeout: int = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def docker(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The rank's own daemon, through its socket in the rank's private /run."""
    return run(["docker", "-H", f"unix://{SIM_RANKS / host / 'run' / 'docker.sock'}", *args])


def docker_import(host: str, ref: str, rootfs_tar: bytes) -> subprocess.CompletedProcess[bytes]:
    socket = SIM_RANKS / host / "run" / "docker.sock"
    return subprocess.run(
        ["docker", "-H", f"unix://{socket}", "import", "-", ref],
        input=rootfs_tar,
        capture_output=True,
        timeout=120,
        check=False,
    )


def image_id(host: str, ref: str) -> str | None:
    done = docker(host, "image", "inspect", "--format", "{{.Id}}", ref)
    return done.stdout.strip() if done.returncode == 0 else None


def rank_path(host: str, path: str) -> Path:
    """Where a rank's private /var/lib/sparkring/... lives on the host."""
    relative = Path(path).relative_to("/var/lib/sparkring")
    return SIM_RANKS / host / "var-lib-sparkring" / relative


def progress(host: str, name: str) -> dict | None:
    path = rank_path(host, TEST_DEST) / f"{name}.progress.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fanout_argv(image: str, *extra: str, check: bool = False) -> list[str]:
    return [
        "ansible-playbook",
        str(PLAYBOOK),
        "-e",
        json.dumps(
            {
                "image_fanout_image": image,
                "image_fanout_dest": TEST_DEST,
                "image_fanout_port": TEST_PORT,
                "image_fanout_chunk_size": 1 << 20,
                "image_fanout_compression_level": 1,
                "image_fanout_connect_timeout": 30,
                "image_fanout_io_timeout": 30,
                "image_fanout_poll_seconds": 1,
            }
        ),
        *extra,
        *(["--check", "--diff"] if check else []),
    ]


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    counts = {}
    for host, fields in re.findall(r"^(r\d)\s+:\s+(.*)$", output, flags=re.M):
        counts[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return counts
