"""A cable's bulk RDMA bandwidth, measured with perftest's ib_write_bw: per function and per cable.

The field's figures for a Spark cable (healthy ~190 Gb/s with both functions at once, ~92-111
Gb/s per function, ~118 Gb/s degraded) are ib_write_bw figures, so cable qualification measures
with the same tool (docs/qualify.md, "Absolute floors"). One end of the cable serves, the other
connects (to the serving end's port address: perftest exchanges its GIDs over TCP, and the RDMA
then runs on the function's own GID, link-local on a twin without an address). Stages, in the
same order on both ends, each on its own TCP port so a late end never meets the wrong stage:
every twin alone, then all twins at once. Standard library only: it ships to the nodes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

# (argv) -> (rc, stdout, stderr), as sparkring_link_facts.Runner.
Runner = Callable[[list[str]], tuple[int, str, str]]

# What the connecting end prints while the serving end is not listening yet (retried until the deadline).
_NOT_LISTENING = ("Couldn't connect to", "Unable to open file descriptor for socket connection")
_COLUMNS = re.compile(r"\s{2,}")


class BandwidthError(Exception):
    """ib_write_bw ran but gave no figure (it failed, or printed something unexpected)."""


def stages(twins: int) -> list[list[int]]:
    """Which twins run together in each stage: each alone, then all at once (one twin: one stage)."""
    alone = [[t] for t in range(twins)]
    return alone + ([list(range(twins))] if twins > 1 else [])


def stage_port(base: int, stage: int, twin: int, twins: int) -> int:
    """A distinct TCP port per (stage, twin): stage s uses base + s * twins + twin."""
    return base + stage * twins + twin


def ib_write_bw_argv(
    tool: str,
    device: str,
    port: int,
    gid_index: int,
    tcp_port: int,
    size_bytes: int,
    duration_s: int,
    server: str | None = None,
    timeout_bin: str | None = None,
    timeout_s: float = 60,
) -> list[str]:
    """ib_write_bw on one function: serving when `server` is None, else connecting to it. -F: a CPU
    frequency warning does not abort the run; --report_gbits: Gb/s, the field's unit."""
    argv = [tool, "-d", device, "-i", str(port), "-x", str(gid_index), "-p", str(tcp_port)]
    argv += ["-s", str(size_bytes), "-D", str(duration_s), "-F", "--report_gbits"]
    if server is not None:
        argv.append(server)
    if timeout_bin:
        argv = [timeout_bin, "--kill-after=5", f"{timeout_s:g}", *argv]
    return argv


def parse_ib_write_bw(out: str) -> float:
    """The 'BW average[Gb/sec]' figure of ib_write_bw's result table.

    The table is a header line naming the columns, then one line of numbers:
        #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
        65536      538000           0.00               94.02              0.179327
    """
    lines = out.splitlines()
    for at, line in enumerate(lines):
        names = _COLUMNS.split(line.strip())
        if not any(name.startswith("BW average[") for name in names):
            continue
        column = next(i for i, name in enumerate(names) if name.startswith("BW average["))
        if names[column] != "BW average[Gb/sec]":
            raise BandwidthError(f"ib_write_bw reported {names[column]}, expected Gb/sec (--report_gbits)")
        for row in lines[at + 1 :]:
            fields = row.split()
            # The row of numbers (a "Conflicting CPU frequency" warning may sit between it and the header).
            if (
                len(fields) > column
                and fields[0].isdigit()
                and all(re.fullmatch(r"[0-9.]+", f) for f in fields)
            ):
                return float(fields[column])
    raise BandwidthError("ib_write_bw printed no result table: " + (out.strip()[-200:] or "no output"))


def serve(run: Runner, argv: list[str]) -> None:
    """The serving side: it waits (bounded by the argv's timeout) for the other end, then ends with it."""
    rc, out, err = run(argv)
    if rc != 0:
        raise BandwidthError(_failure(rc, out, err))


def connect(run: Runner, argv: list[str], deadline: float, retry_s: float = 0.3) -> float:
    """The connecting side, retried until the serving side listens; returns its Gb/s."""
    while True:
        rc, out, err = run(argv)
        if rc == 0:
            return parse_ib_write_bw(out)
        text = f"{out}\n{err}"
        if any(mark in text for mark in _NOT_LISTENING) and time.monotonic() + retry_s < deadline:
            time.sleep(retry_s)
            continue
        raise BandwidthError(_failure(rc, out, err))


def run_stages(
    run: Runner, argv: Callable[[int, int], list[str]], twins: int, serving: bool, timeout_s: float
) -> Iterator[tuple[list[int], list[float]]]:
    """Every stage in order: yields (the stage's twins, their Gb/s; none on the serving end).

    `argv(stage, twin)` builds one run's command; a run that fails raises BandwidthError after the
    stages before it were yielded, so the caller keeps what was measured."""
    for stage, group in enumerate(stages(twins)):
        yield group, _stage(run, [argv(stage, t) for t in group], serving, time.monotonic() + timeout_s)


def _stage(run: Runner, argvs: list[list[str]], serving: bool, deadline: float) -> list[float]:
    """One stage's runs at once: served here (no figures), or connected from here."""
    with ThreadPoolExecutor(max_workers=len(argvs)) as pool:
        if serving:
            list(pool.map(lambda argv: serve(run, argv), argvs))
            return []
        return list(pool.map(lambda argv: connect(run, argv, deadline), argvs))


def _failure(rc: int, out: str, err: str) -> str:
    last = [line.strip() for line in f"{out}\n{err}".splitlines() if line.strip()][-2:]
    why = " (timed out)" if rc in (124, 137) else ""
    return f"ib_write_bw exit {rc}{why}: {' / '.join(last) or 'no output'}"
