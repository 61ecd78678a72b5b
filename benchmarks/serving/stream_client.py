"""One streamed greedy completion against an OpenAI-compatible API, timed on the client.

Importable (`stream(...)`) and runnable as a script, so that the sim ring's client can run inside
the controller's network namespace, the only place rank 0's API is reachable from:

    ip netns exec sr-ctl .venv/bin/python benchmarks/serving/stream_client.py < request.json

The request (url, model, prompt, max_tokens, optional api_key) comes on stdin, so the API key is
never in an argv; one JSON line of timings goes to stdout. Standard library only.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable


def read_stream(lines: Iterable[bytes], clock: Callable[[], float] = time.perf_counter) -> dict:
    """The first-text time and the last usage block of a server-sent-event completion stream."""
    first, usage = None, {}
    for raw in lines:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = clock()
        usage = chunk.get("usage") or usage
    return {"first": first, "usage": usage}


def stream(
    url: str, model: str, prompt: str, max_tokens: int, api_key: str | None = None
) -> dict[str, float]:
    """Time to first token, total time and token counts of one streamed completion (ignore_eos)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), headers)
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        got = read_stream(r)
    end = time.perf_counter()
    usage = got["usage"]
    return {"ttft_s": (got["first"] or end) - start, "total_s": end - start,
            "completion_tokens": usage.get("completion_tokens", 0), "prompt_tokens": usage.get("prompt_tokens", 0)}  # fmt: skip


def main() -> int:
    request = json.load(sys.stdin)
    print(json.dumps(stream(request["url"], request["model"], request["prompt"], request["max_tokens"],
                            request.get("api_key"))))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
