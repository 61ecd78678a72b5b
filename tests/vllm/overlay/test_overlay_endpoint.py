"""The fault endpoint on vLLM's own web stack: a request in flight when the ring fails gets 503.

vLLM can leave a request waiting on an engine that is gone; the plugin must answer it with the
fault's name once the record exists. Real FastAPI and uvicorn from .venv-vllm serve an app with
the plugin's router and middleware and a route that waits as a request on a dead engine would.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from overlay_vllm_harness import REPO, VLLM_BIN, free_port, vllm_missing_reason

from overlay.endpoint import FAULT_POLL_S
from overlay.fault import write_fault

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")

APP = textwrap.dedent(
    """
    import asyncio, json, sys
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from overlay.endpoint import FaultEndpoint
    from overlay.fault import write_fault

    app = FastAPI()
    app.state.engine_client = None
    FaultEndpoint().attach_router(app)

    @app.get("/v1/waits")
    async def waits() -> dict:
        try:
            await asyncio.sleep(120)  # an engine that never answers
        except asyncio.CancelledError:
            await asyncio.sleep(120)  # nor ends when cancelled
            raise
        return {"answered": True}

    @app.get("/v1/answers")
    async def answers() -> dict:
        return {"answered": True}

    @app.get("/v1/fails")
    async def fails() -> JSONResponse:  # the engine died: the record, then vLLM's own 500
        write_fault(json.loads(sys.argv[2]))
        return JSONResponse({"error": "EngineCore encountered an issue"}, status_code=500)

    @app.get("/v1/streams")
    async def streams() -> StreamingResponse:
        async def tokens():
            yield "first "
            await asyncio.sleep(2)
            yield "second"
        return StreamingResponse(tokens())

    @app.get("/metrics")
    async def metrics() -> dict:
        return {"counted": True}

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)
RECORD = {
    "rank": 0,
    "group": "tp:0",
    "dead_rank": 2,
    "message": "rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped answering at 2026-12-07T03:43:49.961Z",
}


def get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served(tmp_path: Path):
    """The app on a free loopback port; its fault record path; stopped afterwards."""
    port, record = free_port(), tmp_path / "fault.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARKRING_FAULT_PATH": str(record)}
    argv = [str(VLLM_BIN / "python"), "-c", APP, str(port), json.dumps(RECORD)]
    server = subprocess.Popen(argv, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # bounded: uvicorn starts in a few seconds
            try:
                if get(f"{base}/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the app did not start in 30 s")
        yield base, record, server
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_request_waiting_when_the_ring_fails_gets_503_naming_the_rank(served) -> None:
    base, record, server = served
    assert get(f"{base}/v1/answers") == (200, json.dumps({"answered": True}, separators=(",", ":")))
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(get, f"{base}/v1/waits")
        time.sleep(1)
        assert not waiting.done()
        written = time.monotonic()
        write_fault(RECORD, record)
        code, body = waiting.result(timeout=10)
    took = time.monotonic() - written
    assert code == 503, (code, body)
    assert json.loads(body)["error"]["message"] == f"the ring failed: {RECORD['message']}"
    assert took < 10 * FAULT_POLL_S, took
    assert get(f"{base}/v1/answers")[0] == 503
    assert get(f"{base}/health")[0] == 503
    assert get(f"{base}/metrics")[0] == 200, "what was counted stays readable"
    # vLLM's server shuts down when its engine dies, and waits for every request it still runs.
    server.terminate()
    server.wait(timeout=10)


def test_a_5xx_made_as_the_ring_fails_becomes_the_faults_503(served) -> None:
    base, _, _ = served
    code, body = get(f"{base}/v1/fails")
    assert code == 503 and json.loads(body)["error"]["message"] == f"the ring failed: {RECORD['message']}"


def test_an_answer_already_streaming_when_the_ring_fails_stays_the_apps(served) -> None:
    base, record, _ = served
    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(get, f"{base}/v1/streams")
        time.sleep(1)
        write_fault(RECORD, record)
        assert streaming.result(timeout=10) == (200, "first second")
