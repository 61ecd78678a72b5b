"""Device lane: a process holding the GPU is seen and named by the occupied-GPU check.

PF-GPU-FREE (preflight) and the launch's attestation both read `nvidia-smi --query-compute-apps`
through module_utils/sparkring_gpu.py; the unit tests feed it nvidia-smi's row format, this test
feeds it the real nvidia-smi while a real process holds GPU memory, and again after that process
is gone. Standalone (no Ansible needed), from the repository root:

    python3 -m pytest -q tests/device/gpu

Needs nvidia-smi and torch with CUDA; skips otherwise. Run it where nvidia-smi sees the host's
processes (a container without the host's PID namespace sees none, and the test says so).
"""

from __future__ import annotations

import select
import shutil
import subprocess
import sys
import time

import pytest
from sparkring.module_utils import load_module_utils

pytestmark = pytest.mark.device
# 256 MiB of float32 on the GPU, held until killed (bounded by the sleep).
HOLDER = (
    "import sys, time, torch\n"
    "x = torch.ones(64 << 20, device='cuda'); torch.cuda.synchronize()\n"
    "print('holding', flush=True); time.sleep(float(sys.argv[1]))\n"
)


def sparkring_gpu():
    """module_utils/sparkring_gpu.py as the modules ship it (stdlib only; no Ansible on this lane)."""
    return load_module_utils("sparkring_gpu")


def compute_apps(smi: str, gpu) -> tuple[str, list]:
    done = subprocess.run(
        [smi, *gpu.COMPUTE_APPS_ARGS], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout, gpu.parse_compute_apps(done.stdout)


def wait_for(predicate, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1.0)
    return predicate()


def test_a_process_holding_the_gpu_is_named_and_gone_once_it_exits() -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("no nvidia-smi on this machine")
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.stdout.strip() != "True":
        pytest.skip(
            f"needs torch with CUDA in {sys.executable}: {probe.stdout.strip() or probe.stderr[-300:]}"
        )
    gpu = sparkring_gpu()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "300"], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 180)
        assert ready and holder.stdout.readline().strip() == "holding", "the holder did not reach the GPU"
        seen: dict = {}

        def listed() -> bool:
            seen["raw"], seen["rows"] = compute_apps(smi, gpu)
            return holder.pid in [row.pid for row in seen["rows"]]

        assert wait_for(listed), (
            f"nvidia-smi does not list the holder (pid {holder.pid}) while it holds 256 MiB; it printed "
            f"{seen['raw']!r}. If this runs in a container without the host's PID namespace, nvidia-smi "
            "cannot see processes here: run it on the host."
        )
        foreign = gpu.foreign_processes(seen["rows"], lambda container: False)
        line = gpu.describe(foreign)
        assert f"pid {holder.pid} " in line, line
        assert "MiB" in line or "[N/A]" in line, line
        print(f"\nnvidia-smi rows while held: {seen['raw']!r}\nrefusal names: {line}")
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert wait_for(lambda: holder.pid not in [row.pid for row in compute_apps(smi, gpu)[1]]), (
        f"pid {holder.pid} is still listed after it exited"
    )
