"""Helpers for the model stage's sim tests: a test profile and lock beside the real ones, each
rank's model directories as seen from the host, and runs of the stage as a user runs a playbook.

The tests stage into /opt/sparkring/models-test on the ranks (never the sim's own MODEL_PATH, which
a running deployment mounts): the sim's tiny model as the target and a generated multi-shard
checkpoint as the draft, both pinned in a copy of images/lock.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from benchmarks.model_fanout.checkpoint import generate

ROOT = Path(__file__).resolve().parents[3]

RANKS = ("r0", "r1", "r2", "r3")
SIM_RANKS = Path("/var/lib/sparkring-sim/ranks")
TEST_ROOT = "/opt/sparkring/models-test"
TARGET = f"{TEST_ROOT}/sim-tiny"
DRAFT = f"{TEST_ROOT}/bulk"
PLAYBOOK = Path(__file__).with_name("model.yml")
SIM_MODEL = ROOT / ".cache" / "sim-model"
TEST_PORT = 29621


def project_env() -> dict[str, str]:
    """The environment `make` gives a playbook: the venv first on PATH, the project's ansible.cfg."""
    values = dict(os.environ)
    values["PATH"] = f"{ROOT / '.venv' / 'bin'}:{values.get('PATH', '')}"
    values.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return values


def rank_path(host: str, path: str) -> Path:
    """Where a rank's private /opt/sparkring/... lives on the host."""
    return SIM_RANKS / host / "opt-sparkring" / Path(path).relative_to("/opt/sparkring")


def record(host: str, path: str) -> dict | None:
    where = rank_path(host, path)
    try:
        return json.loads((where.parent / ".sparkring-models" / f"{where.name}.json").read_text())
    except (OSError, ValueError):
        return None


def progress(host: str, path: str) -> dict | None:
    where = rank_path(host, path)
    try:
        return json.loads((where.parent / ".sparkring-models" / f"{where.name}.progress.json").read_text())
    except (OSError, ValueError):
        return None


def holds(host: str, path: str, files: list[dict]) -> bool:
    """The rank's directory holds exactly these files, byte for byte (hashed here, from the host)."""
    top = rank_path(host, path)
    if not top.is_dir():
        return False
    names = sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())
    if names != sorted(f["path"] for f in files):
        return False
    return all(hashlib.sha256((top / f["path"]).read_bytes()).hexdigest() == f["sha256"] for f in files)


def clean_ranks() -> None:
    for host in RANKS:
        shutil.rmtree(rank_path(host, TEST_ROOT), ignore_errors=True)


class Stage:
    """A test profile, lock and draft checkpoint; runs of the model stage against them."""

    def __init__(self, work: Path, draft_mib: int, shards: int, **profile: str) -> None:
        self.work = work
        self.draft_source = work / "bulk"
        self.draft_files = generate(self.draft_source, draft_mib, shards)
        lock = json.loads((ROOT / "images" / "lock.json").read_text())
        self.target_files = lock["models"]["sim-target"]["files"]
        self.draft_revision = f"bulk-{draft_mib}m-{shards}"
        lock["models"]["sim-bulk"] = {
            "role": "draft",
            "source": "generated",
            "generator": "benchmarks/model_fanout/checkpoint.py",
            "revision": self.draft_revision,
            "files": self.draft_files,
        }
        self.lock = work / "lock.json"
        self.lock.write_text(json.dumps(lock, indent=1))
        self.profile = self.write_profile(**profile)

    def write_profile(self, **overrides: str) -> Path:
        keys = {
            "MODEL_PATH": TARGET,
            "MODEL_REVISION": "sim-tiny-v1",
            "DRAFT_PATH": DRAFT,
            "DRAFT_REVISION": self.draft_revision,
        } | overrides
        lines = [
            line
            for line in (ROOT / "inventories" / "sim" / "launch.env").read_text().splitlines()
            if line.partition("=")[0] not in keys
        ]
        path = self.work / "launch.env"
        path.write_text("\n".join(lines + [f"{k}={v}" for k, v in keys.items()]) + "\n")
        return path

    def argv(self, *extra: str, check: bool = False, **overrides) -> list[str]:
        values = {
            "model_profile_file": str(self.profile),
            "model_lock_file": str(self.lock),
            "model_target": "sim-target",
            "model_draft": "sim-bulk",
            "model_sources": {"sim-target": str(SIM_MODEL), "sim-bulk": str(self.draft_source)},
            "model_chunk_size": 1 << 20,
            "model_port": TEST_PORT,
            "model_connect_timeout": 30,
            "model_io_timeout": 30,
            "model_poll_seconds": 1,
        } | overrides
        return [
            "ansible-playbook",
            str(PLAYBOOK),
            "-e",
            json.dumps(values),
            *extra,
            *(["--check", "--diff"] if check else []),
        ]


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host."""
    counts = {}
    for host, fields in re.findall(r"^(r\d)\s+:\s+(.*)$", output, flags=re.M):
        counts[host] = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", fields)}
    return counts
