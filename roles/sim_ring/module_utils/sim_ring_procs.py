# Copyright: SparkRing contributors
# Apache-2.0
"""Find and stop the processes of one simulated rank (stdlib only: it ships with the modules).

A simulated node is not a PID namespace, so "its" processes are recognised by the kernel
objects they hold: the rank's network namespace (sshd, dockerd, containerd, shims, ssh
sessions, host-network containers) or the rank's container cgroup parent (containers with
their own network namespace). Nothing else on the machine matches either.
"""

from __future__ import annotations

import os
import signal
import time


def netns_inode(path: str) -> int | None:
    """Inode of a named network namespace (/run/netns/NAME), None when it does not exist."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _proc_netns(pid: int) -> int | None:
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return int(link[len("net:[") : -1]) if link.startswith("net:[") else None


def _proc_in_cgroup(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            return any(marker in line for line in f)
    except OSError:
        return False


def pids_of(netns_ino: int | None, cgroup_marker: str | None = None) -> list[int]:
    """Pids in the given network namespace or under the given cgroup path component."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if (netns_ino is not None and _proc_netns(pid) == netns_ino) or (
            cgroup_marker is not None and _proc_in_cgroup(pid, cgroup_marker)
        ):
            found.append(pid)
    return found


def pid_alive_in(pid: int, netns_ino: int | None) -> bool:
    """True when pid exists, is not a zombie and lives in the given network namespace."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and netns_ino is not None and _proc_netns(pid) == netns_ino


def read_pidfile(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def terminate(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM the pids, wait up to grace_s, SIGKILL what is left; returns the pids signalled."""
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_exists(p) for p in signalled):
        time.sleep(0.1)
    for pid in signalled:
        if _exists(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
    return signalled


def _exists(pid: int) -> bool:
    """A pid that is gone or a zombie (reaped later by its parent) counts as stopped."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
