"""One streamed greedy completion against an OpenAI-compatible API, timed on the client.

The client itself is module_utils/sparkring_stream.py (the acceptance cells run the same code on
rank 0); this file is its command line and the benchmark's import, so that the sim ring's client
can run inside the controller's network namespace, the only place rank 0's API is reachable from:

    ip netns exec sr-ctl .venv/bin/python -m benchmarks.serving.stream_client < request.json

The request (url, model, prompt, max_tokens, optional api_key) comes on stdin, so the API key is
never in an argv; one JSON line of timings goes to stdout. A failed request raises (the
benchmark's figures must not include it). Standard library only.
"""

from __future__ import annotations

import json
import sys

from sparkring.module_utils import load_module_utils

sparkring_stream = load_module_utils("sparkring_stream")

TIMINGS = ("ttft_s", "total_s", "completion_tokens", "prompt_tokens")


def stream(
    url: str, model: str, prompt: str, max_tokens: int, api_key: str | None = None
) -> dict[str, float]:
    """Time to first token, total time and token counts of one streamed completion (ignore_eos)."""
    got = sparkring_stream.stream(url, model, prompt, max_tokens, api_key)
    if got["error"]:
        raise RuntimeError(f"completion request to {url} failed: {got['error']}")
    return {key: got[key] for key in TIMINGS}


def main() -> int:
    request = json.load(sys.stdin)
    print(
        json.dumps(
            stream(
                request["url"],
                request["model"],
                request["prompt"],
                request["max_tokens"],
                request.get("api_key"),
            )
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
