"""module_utils/sparkring_stream.py (the one streaming client) against a local server-sent-event
server: what it reads from a stream, what it reports when a request fails, and how it paces rounds.
The real vLLM API is exercised by the acceptance tests at the end of tests/sim/launch/test_launch_sim.py
(the cells) and by the serving benchmark."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

from ansible.module_utils.sparkring_stream import run_rounds, stream


class Api(BaseHTTPRequestHandler):
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    bodies: ClassVar[list[dict]] = []

    def log_message(self, *args) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Api.bodies.append(body)
        prompt = body["prompt"]
        if prompt == "too long":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "maximum context length is 2048 tokens"}}')
            return
        with Api.lock:
            Api.in_flight += 1
            Api.peak = max(Api.peak, Api.in_flight)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("The", " ring", " of four"):
            time.sleep(0.05)
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': piece}]})}\n\n".encode())
            self.wfile.flush()
        with Api.lock:
            Api.in_flight -= 1
        if prompt == "drop":
            return  # the connection closes without the usage block and [DONE]
        usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": 3}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@contextmanager
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_stream_gives_text_tokens_and_time_to_first_token() -> None:
    with api() as url:
        got = stream(url, "m", [1, 2, 3, 4], 3, api_key="k")
    assert got["error"] is None and got["text"] == "The ring of four"
    assert (got["prompt_tokens"], got["completion_tokens"]) == (4, 3)
    assert 0 < got["ttft_s"] < got["total_s"] and got["started"] < got["first_token"] < got["ended"]


def test_a_failed_request_is_a_result_with_the_servers_message() -> None:
    with api() as url:
        refused = stream(url, "m", "too long", 3)
        dropped = stream(url, "m", "drop", 3)
    assert refused["error"] == 'HTTP 400: {"error": {"message": "maximum context length is 2048 tokens"}}'
    assert dropped["error"] == "the stream ended without [DONE]" and dropped["text"] == "The ring of four"
    closed = stream("http://127.0.0.1:9", "m", "x", 3, timeout_s=5)
    assert closed["error"].startswith("URLError") and closed["completion_tokens"] == 0


def test_rounds_send_concurrency_requests_at_once_and_keep_the_order() -> None:
    Api.peak = 0
    with api() as url:
        results = run_rounds(
            [{"id": f"r{i}", "prompt": [i] * (i + 1)} for i in range(7)],
            3,
            lambda r: stream(url, "m", r["prompt"], 3),
        )
    assert [r["id"] for r in results] == [f"r{i}" for i in range(7)]
    assert [r["round"] for r in results] == [0, 0, 0, 1, 1, 1, 2]
    assert [r["prompt_tokens"] for r in results] == list(range(1, 8))
    assert Api.peak == 3
    assert max(r["ended"] for r in results[:3]) <= min(r["started"] for r in results[3:6])


def test_greedy_unless_the_request_samples_as_the_launch_warm_up_does() -> None:
    """The timed cells are greedy; the launch's warm-up gate sends temperature > 0 and n > 1."""
    Api.bodies = []
    with api() as url:
        greedy = stream(url, "m", "a", 3)
        sampled = stream(url, "m", "b", 3, sampling={"temperature": 0.8, "top_p": 0.95, "n": 2})
    assert greedy["error"] is None and sampled["error"] is None
    assert Api.bodies[0]["temperature"] == 0 and "n" not in Api.bodies[0]
    assert (Api.bodies[1]["temperature"], Api.bodies[1]["top_p"], Api.bodies[1]["n"]) == (0.8, 0.95, 2)
