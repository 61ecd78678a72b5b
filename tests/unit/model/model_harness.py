"""The model stage's module as the tests run it: a process per rank (as Ansible runs it on a node),
its arguments in a file, its JSON result read back; and the lock's manifest of a directory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MODULE = ROOT / "library" / "sparkring_model.py"
PIN_MODULE = ROOT / "library" / "sparkring_model_pin.py"
CHUNK = 64 * 1024


def pinned_files(source: Path) -> list[dict]:
    """The lock's manifest of a directory: every file's path, size and sha256."""
    return [
        {
            "path": str(p.relative_to(source)),
            "size": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in sorted(source.rglob("*"))
        if p.is_file()
    ]


def start(
    args: dict, tmp_path: Path, check: bool = False, diff: bool = False, module: Path = MODULE
) -> subprocess.Popen:
    flags = {"_ansible_check_mode": check, "_ansible_diff": diff}
    path = tmp_path / f"args-{os.getpid()}-{id(args)}.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, **flags}}))
    return subprocess.Popen(
        [sys.executable, str(HERE / "run_module.py"), str(module), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> dict:
    out, err = proc.communicate(timeout=timeout)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"failed": True, "msg": f"no JSON (rc {proc.returncode}): {out[-2000:]} {err[-2000:]}"}
