#!/usr/bin/python
"""Ansible module: streamed greedy completions against the deployment's OpenAI API, timed on the client."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_completions
short_description: Send streamed completions (greedy unless told) to the OpenAI API and time them
description:
  - Sends O(requests) to C(<url>/v1/completions) with C(stream=true) (greedy, C(temperature=0), unless a
    request sets its sampling), and returns,
    per request, the time to first token, the total time, the token counts from the usage block and
    the text, measured by the client (module_utils/sparkring_stream, the serving benchmark's client).
  - Requests go O(concurrency) at a time, in rounds; each round starts its requests together.
  - A failed request (HTTP error, refused or dropped connection, a stream without its end marker) is a
    result with C(error) set, not a module failure, so a caller can count errors. Runs on the rank
    that serves the API (the acceptance role delegates it to rank 0 and calls 127.0.0.1).
version_added: "0.1.0"
author: SparkRing
options:
  url:
    description: Base URL of the API (no C(/v1)).
    type: str
    default: http://127.0.0.1:8000
  model:
    description: The served model name.
    type: str
    required: true
  api_key:
    description: Bearer token when the deployment has C(VLLM_API_KEY); never returned or logged.
    type: str
    default: ""
  requests:
    description: The completions to send, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      id:
        description: Names the request in the results.
        type: str
        required: true
      prompt:
        description: A string, or a list of token ids (exact prompt lengths).
        type: raw
        required: true
      max_tokens:
        description: Tokens to generate.
        type: int
        required: true
      ignore_eos:
        description: Generate O(max_tokens) even past an end-of-sequence token (timed cells); false for plain greedy output.
        type: bool
        default: true
      temperature:
        description: Sampling temperature; 0 is greedy (every timed cell). The launch's warm-up samples above 0.
        type: float
        default: 0
      top_p:
        description: Nucleus sampling mass.
        type: float
        default: 1.0
      n:
        description: Completions per request (parallel sampling).
        type: int
        default: 1
  concurrency:
    description: Requests in flight at once.
    type: int
    default: 1
  timeout_s:
    description: Bound on each request, seconds.
    type: float
    default: 600
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is sent.
  diff_mode:
    support: none
    details: Nothing on the node changes, so there is no diff.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Two greedy completions, one at a time, from rank 0 to its own API
  sparkring_completions:
    model: sim-tiny
    api_key: "{{ launch_api_key }}"
    requests:
      - {id: a, prompt: "The ring of four", max_tokens: 16, ignore_eos: false}
      - {id: b, prompt: [101, 202, 303], max_tokens: 16}
  delegate_to: "{{ groups['sparkring_head'][0] }}"
  run_once: true
"""

RETURN = r"""
results:
  description:
    - Per request, in order - C(id), C(round), C(ttft_s), C(total_s), C(started), C(first_token) and
      C(ended) (seconds since the module started; C(first_token) null when no text came), C(prompt_tokens),
      C(completion_tokens), C(text) and C(error) (null when it succeeded).
  returned: always
  type: list
  elements: dict
errors:
  description: How many requests failed.
  returned: always
  type: int
seconds:
  description: Wall time of all the requests.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_stream import run_rounds, stream


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "default": "http://127.0.0.1:8000"},
            "model": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "requests": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "id": {"type": "str", "required": True},
                    "prompt": {"type": "raw", "required": True},
                    "max_tokens": {"type": "int", "required": True},
                    "ignore_eos": {"type": "bool", "default": True},
                    "temperature": {"type": "float", "default": 0},
                    "top_p": {"type": "float", "default": 1.0},
                    "n": {"type": "int", "default": 1},
                },
            },
            "concurrency": {"type": "int", "default": 1},
            "timeout_s": {"type": "float", "default": 600},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["concurrency"] < 1:
        module.fail_json(msg=f"concurrency: {p['concurrency']}; it must be at least 1")
    for r in p["requests"]:
        prompt = r["prompt"]
        if not (
            isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))
        ):
            module.fail_json(
                msg=f"requests[{r['id']}].prompt: a string or a list of token ids, got {type(prompt).__name__}"
            )
    if module.check_mode:
        module.exit_json(changed=False, results=[], errors=0, seconds=0.0)

    def send(r: dict) -> dict:
        sampling = {"temperature": r["temperature"], "top_p": r["top_p"], "n": r["n"]}
        return stream(
            p["url"],
            p["model"],
            r["prompt"],
            r["max_tokens"],
            p["api_key"] or None,
            p["timeout_s"],
            r["ignore_eos"],
            sampling,
        )

    origin = time.perf_counter()
    results = run_rounds(p["requests"], p["concurrency"], send)
    seconds = time.perf_counter() - origin
    for r in results:
        for key in ("started", "first_token", "ended"):
            r[key] = None if r[key] is None else round(r[key] - origin, 6)
    module.exit_json(
        changed=False,
        results=results,
        errors=sum(1 for r in results if r["error"]),
        seconds=round(seconds, 3),
    )


if __name__ == "__main__":
    main()
