"""Streamed greedy completions against an OpenAI-compatible API, timed on the client.

The one streaming client: the serving benchmark (benchmarks/serving/stream_client.py) and the
acceptance cells (library/sparkring_completions.py, on rank 0) both call it. Standard library
only: it travels to a rank inside a module. A request may fail (HTTP error, dropped stream); that
is a result (``error``), never an exception, so a cell counts its errors instead of stopping.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable

ERROR_BODY_CHARS = 300


def read_stream(lines: Iterable[bytes], clock: Callable[[], float] = time.perf_counter) -> dict:
    """The first-text time, the text and the last usage block of a server-sent-event stream."""
    first, usage, text, done = None, {}, [], False
    for raw in lines:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
            continue
        if not line.startswith("data:"):
            continue
        chunk = json.loads(line[5:])
        piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
        if first is None and piece:
            first = clock()
        text.append(piece)
        usage = chunk.get("usage") or usage
    return {"first": first, "usage": usage, "text": "".join(text), "done": done}


def stream(
    url: str,
    model: str,
    prompt: str | list[int],
    max_tokens: int,
    api_key: str | None = None,
    timeout_s: float = 600,
    ignore_eos: bool = True,
    sampling: dict | None = None,
) -> dict:
    """Time to first token, total time, token counts and text of one streamed completion; greedy
    unless ``sampling`` sets other parameters (temperature, top_p, n: the launch's warm-up).

    ``started``/``first_token``/``ended`` are perf_counter readings (comparable across the
    threads of one process); ``error`` is set, and the timings are partial, when it failed."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(sampling or {}),
    }
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers)
    start = time.perf_counter()
    got, error = {"first": None, "usage": {}, "text": "", "done": False}, None
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            got = read_stream(r)
        if not got["done"]:
            error = "the stream ended without [DONE]"
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:ERROR_BODY_CHARS]
        error = f"HTTP {exc.code}: {detail}"
    except (OSError, ValueError) as exc:  # refused, reset, timed out, a line that is not JSON
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    usage = got["usage"]
    return {
        "ttft_s": (got["first"] or end) - start,
        "total_s": end - start,
        "started": start,
        "first_token": got["first"],
        "ended": end,
        "completion_tokens": usage.get("completion_tokens", 0),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "text": got["text"],
        "error": error,
    }


def run_rounds(requests: list[dict], concurrency: int, send: Callable[[dict], dict]) -> list[dict]:
    """Send ``requests`` ``concurrency`` at a time: each round starts its requests together and ends
    when all of them have; the results keep the requests' order and carry their round."""
    width = max(1, concurrency)
    results: list[dict] = [{} for _ in requests]

    def one(i: int) -> None:
        results[i] = {**send(requests[i]), "id": requests[i].get("id", i), "round": i // width}

    for first in range(0, len(requests), width):
        threads = [
            threading.Thread(target=one, args=(i,)) for i in range(first, min(first + width, len(requests)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return results
