#!/usr/bin/env python3
"""Attest inside the container, then run vLLM (docs/design.md §3.5: nothing starts unattested).

The build wrote /opt/sparkring/image.json: the lock's sha256, the vLLM version, the sha256 of
every file of the transport, overlay and SparkCache sources installed in the image, and of the
patched NCCL library on GB10. Before vLLM starts this checks each of them against the bytes
actually present, prints one attestation record (JSON, one line, on stderr; also written to
$SPARKRING_ATTEST_PATH when set) and only then runs `vllm ARGS...`. Any mismatch exits 78
(EX_CONFIG) naming the file: a silently altered image never serves.

vLLM runs as this process's child (signals forwarded, orphans reaped), so the container's exit
status says why it ended, with one last line on stderr naming the cause (docs/launch.md,
"Exit statuses"): 0 stopped on request (SIGTERM/SIGINT, `docker stop`), 69 the ring failed (the
overlay's fault record names the rank and the cable: overlay/fault.py), 70 vLLM ended on its own
with status 0, 78 refused (attestation, or the overlay refusing an unpinned vLLM), else vLLM's
own status (128 + N when a signal N ended it).

Once the fault record exists vLLM has SPARKRING_FAULT_GRACE_S (5 s) to leave by itself; then it
gets SIGTERM and, after as long again, SIGKILL (in the container this process is PID 1, so its
exit ends vLLM's own children too). vLLM's API server can outlive its dead worker (its engine
never told), and a rank that stays up after the ring failed would hold the recovery back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata

# The image's copy of module_utils/sparkring_integrity.py, beside this file (the script's folder
# is on the path): the same hashing and secret names as everywhere else.
from sparkring_integrity import redact_env, sha256_file

IMAGE_JSON = os.environ.get("SPARKRING_IMAGE_JSON", "/opt/sparkring/image.json")
EX_CONFIG = 78
EX_SOFTWARE = 70  # vLLM ended by itself, status 0, without being asked to
EX_RING_FAILED = 69  # overlay.fault.EXIT_PEER_DEAD: a ring peer stopped answering
FAULT_FILE = "sparkring-fault.json"
REAP_POLL_S = 0.2  # how often the wait for vLLM looks for the fault record


def attest(image: dict) -> tuple[dict, list[str]]:
    """The record and the list of problems (empty means attested)."""
    problems = []
    root = image["files_root"]
    for name, expected in sorted(image["files"].items()):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            problems.append(f"{path}: missing (the image expects sha256 {expected})")
        elif sha256_file(path) != expected:
            problems.append(f"{path}: sha256 differs from the build record")
    nccl = image.get("nccl")
    nccl_actual = None
    if nccl:
        nccl_actual = sha256_file(nccl["path"]) if os.path.isfile(nccl["path"]) else None
        if nccl_actual != nccl["sha256"]:
            problems.append(f"{nccl['path']}: sha256 {nccl_actual} != patched NCCL {nccl['sha256']}")
    try:
        vllm_version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        vllm_version = None
    if vllm_version != image["vllm_version"]:
        problems.append(f"vllm {vllm_version} installed, the image was built for {image['vllm_version']}")
    env = redact_env(
        {key: value for key, value in os.environ.items() if key.startswith(("SPARKRING_", "VLLM_", "NCCL_"))}
    )
    record = {
        "lock_sha256": image["lock_sha256"],
        "sources_sha256": image["sources_sha256"],
        "vllm_version": vllm_version,
        "nccl_sha256": nccl_actual,
        "files_checked": len(image["files"]),
        "argv": ["vllm", *sys.argv[1:]],
        "env": env,
        "attested": not problems,
    }
    return record, problems


def main() -> int:
    try:
        with open(IMAGE_JSON, encoding="utf-8") as handle:
            image = json.load(handle)
    except (OSError, ValueError) as error:
        print(
            f"sparkring entrypoint: cannot read {IMAGE_JSON}: {error}; not a SparkRing image", file=sys.stderr
        )
        return EX_CONFIG
    record, problems = attest(image)
    line = json.dumps(record, sort_keys=True)
    print(line, file=sys.stderr, flush=True)
    target = os.environ.get("SPARKRING_ATTEST_PATH")
    if target:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
    if problems:
        for problem in problems:
            print(f"sparkring entrypoint: {problem}", file=sys.stderr)
        print("sparkring entrypoint: attestation failed, vLLM not started", file=sys.stderr)
        return EX_CONFIG
    if os.environ.get("SPARKRING_ATTEST_ONLY") == "1":
        return 0
    return serve(sys.argv[1:])


def fault_path() -> str:
    """Where the overlay writes its fault record: set here for vLLM, so both agree."""
    if not os.environ.get("SPARKRING_FAULT_PATH"):
        folder = os.environ.get("SPARKRING_OVERLAY_RECORDER_DIR") or "/tmp"
        os.environ["SPARKRING_FAULT_PATH"] = os.path.join(folder, FAULT_FILE)
    return os.environ["SPARKRING_FAULT_PATH"]


def read_fault(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def serve(args: list[str]) -> int:
    """Run vLLM to its end; the exit status and the last line say why it ended."""
    grace_s = fault_grace_s()
    if grace_s is None:
        print(
            f"sparkring entrypoint: exit {EX_CONFIG}: SPARKRING_FAULT_GRACE_S="
            f"{os.environ['SPARKRING_FAULT_GRACE_S']!r} is not a number of seconds > 0; vLLM not started",
            file=sys.stderr,
            flush=True,
        )
        return EX_CONFIG
    fault = fault_path()
    if os.path.exists(fault):  # a record from an earlier run in this container says nothing now
        os.unlink(fault)
    asked: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        for child in children:
            child.send_signal(signum)

    # The handlers come first: a stop that arrives while vLLM starts must not kill us unforwarded.
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    child = subprocess.Popen(["vllm", *args])
    children.append(child)
    if asked:  # asked for while Popen ran: vLLM did not exist to hear it
        child.send_signal(asked[0])
    stopped: list[str] = []
    status = reap(child.pid, fault, grace_s, stopped)
    code, why = outcome(status, asked, read_fault(fault), stopped)
    print(f"sparkring entrypoint: exit {code}: {why}", file=sys.stderr, flush=True)
    return code


def fault_grace_s() -> float | None:
    """How long vLLM may stay up after the fault record appears (SPARKRING_FAULT_GRACE_S, else
    5 s); None when the setting is not a number of seconds > 0."""
    try:
        grace = float(os.environ.get("SPARKRING_FAULT_GRACE_S", "5"))
    except ValueError:
        return None
    return grace if grace > 0 else None


def reap(pid: int, fault: str, grace_s: float, stopped: list[str]) -> int:
    """Wait for `pid`, reaping any orphan handed to us (PID 1) meanwhile; its wait status.
    Once the fault record exists, each `grace_s` vLLM is still up brings the next stop: SIGTERM,
    then SIGKILL (named in `stopped`)."""
    stops = [signal.SIGTERM, signal.SIGKILL]
    deadline: float | None = None
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done == pid:
            return status
        if done:
            continue  # an orphan: look again at once
        now = time.monotonic()
        if deadline is None:
            if os.path.exists(fault):
                deadline = now + grace_s
        elif now >= deadline and stops:
            stop = stops.pop(0)
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: the next wait reaps it
                os.kill(pid, stop)
            stopped.append(f"{stop.name} after {grace_s * (len(stopped) + 1):g} s")
            deadline = now + grace_s
        time.sleep(REAP_POLL_S)


def outcome(status: int, asked: list[int], fault: dict | None, stopped: list[str]) -> tuple[int, str]:
    """The container's exit status and the cause, from vLLM's wait status, the signals we
    forwarded, the overlay's fault record and the stops sent after it."""
    code = os.waitstatus_to_exitcode(status)
    said = f"vLLM exited with {code}" if code >= 0 else f"vLLM was killed by signal {-code}"
    if asked:
        return 0, f"stopped on request ({signal.Signals(asked[0]).name}); {said}"
    if fault is not None:
        rank = fault.get("rank", "?")
        if stopped:
            said = f"vLLM had not left after the fault, so it was sent {', then '.join(stopped)}; {said}"
        return EX_RING_FAILED, f"the ring failed on rank {rank}: {fault.get('message', 'no message')}; {said}"
    if code == EX_CONFIG:
        return EX_CONFIG, "vLLM refused to start (see the line above: the overlay names the patch)"
    if code == 0:
        return EX_SOFTWARE, "vLLM ended on its own with status 0 (its engine or a worker stopped; see above)"
    if code < 0:
        return 128 - code, said
    return code, said


if __name__ == "__main__":
    sys.exit(main())
