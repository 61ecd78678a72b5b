"""Who holds a rank's GPU: nvidia-smi's compute processes, less this cluster's own containers.

A GB10's memory is shared by CPU and GPU: a stray process on the GPU (a previous vLLM, a notebook)
means an out-of-memory at model load on one rank after the others started. Preflight
(PF-GPU-FREE) and the launch's attestation both ask this before anything changes; processes in
this cluster's own containers (a previous launch, which the launch replaces) are not in the way.

Standard library only: this file travels to the ranks with the modules.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

# The name goes last: it is the one field that may itself hold ", ".
COMPUTE_APPS_ARGS = ("--query-compute-apps=pid,gpu_uuid,used_memory,process_name", "--format=csv,noheader")
# Some drivers answer an empty query with this sentence instead of nothing.
NO_PROCESSES = "No running processes found"
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


class GpuQueryError(ValueError):
    """nvidia-smi answered something this parser does not understand (never read as "free")."""


@dataclass(frozen=True)
class GpuProcess:
    """One compute process on a GPU, as nvidia-smi reports it (host PID)."""

    pid: int
    gpu_uuid: str
    used_memory: str  # "1024 MiB", or "[N/A]" where the driver does not account it (GB10)
    name: str

    def __str__(self) -> str:
        return f"pid {self.pid} {self.name} ({self.used_memory} on {self.gpu_uuid})"


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """The rows of `nvidia-smi COMPUTE_APPS_ARGS`; any row that is not one is an error."""
    processes = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line == NO_PROCESSES:
            continue
        fields = line.split(", ", 3)
        if len(fields) != 4 or not fields[0].isdigit():
            raise GpuQueryError(
                f"nvidia-smi compute-apps row {line!r} is not 'pid, gpu_uuid, used_memory, name'"
            )
        processes.append(GpuProcess(int(fields[0]), fields[1], fields[2], fields[3]))
    return processes


def container_id(pid: int, proc: str = "/proc") -> str | None:
    """The container a process runs in, from the 64-hex id in its cgroup path (None: not in one)."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8") as handle:
            match = _CONTAINER_ID.search(handle.read())
    except OSError:
        return None
    return match.group(0) if match else None


def foreign_processes(
    processes: list[GpuProcess], is_ours: Callable[[str], bool], proc: str = "/proc"
) -> list[GpuProcess]:
    """The processes not in one of this cluster's containers (`is_ours(container_id)`)."""
    foreign = []
    for process in processes:
        container = container_id(process.pid, proc)
        if container is None or not is_ours(container):
            foreign.append(process)
    return foreign


def describe(processes: list[GpuProcess]) -> str:
    """One line naming every holder: what a person needs to find and stop them."""
    return "; ".join(str(process) for process in processes)
