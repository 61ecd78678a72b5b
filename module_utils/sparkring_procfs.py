# Copyright: SparkRing contributors. Apache-2.0.
"""Who listens on a port, read from /proc: the sockets of this network namespace and their holders.

Preflight's PF-PORTS-FREE reads these instead of running `ss`, so a node needs no iproute2 socket
tools and the answer names the holding process. Standard library only: it ships to the nodes.
"""

from __future__ import annotations

import os

# /proc/net state codes of a listening TCP socket and a bound UDP socket.
_LISTEN_STATE = {"tcp": "0A", "udp": "07"}


def listening_sockets(protocol: str, proc: str = "/proc") -> dict[int, set[int]]:
    """Port -> inodes of its listening (TCP) or bound (UDP) sockets in this network namespace."""
    ports: dict[int, set[int]] = {}
    for name in (protocol, protocol + "6"):
        try:
            with open(os.path.join(proc, "net", name), encoding="ascii") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN_STATE[protocol]:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                ports.setdefault(port, set()).add(int(fields[9]))
    return ports


def socket_holders(inodes: set[int], proc: str = "/proc") -> dict[int, str]:
    """PID -> command name of every process holding one of these sockets."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = {}
    for pid in filter(str.isdigit, os.listdir(proc)):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            held = any(os.readlink(os.path.join(fd_dir, fd)) in wanted for fd in os.listdir(fd_dir))
            if held:
                with open(os.path.join(proc, pid, "comm"), encoding="utf-8", errors="replace") as handle:
                    holders[int(pid)] = handle.read().strip()
        except OSError:
            continue  # the process ended or is not ours to read
    return holders
