"""The serving benchmark's runs: which deployments, in which order, and what their rounds add up to.

A run is a fixed order of deployments (stock, overlay, stock, overlay, ...; stock's variants in
turn), each measured for some rounds. Deployments are appended to a log as they finish, so a run
can be measured in bounded chunks; `summarize` turns a complete run into the results: per side
every round and the medians, the ratios to the faster stock variant for each figure, and how many
rounds ran with more load than cores. Pure functions and the plot; bench.py measures.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import statistics
import time
from pathlib import Path

from benchmarks.history import load_runs


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration a deployment runs: stock (OVERLAY_MODE disabled) on a network, or the overlay."""

    name: str
    mode: str  # SPARKRING_OVERLAY_MODE
    network: str  # what should carry the collectives: management, ring, loopback, ring-transport

    @property
    def stock(self) -> bool:
        return self.mode == "disabled"


OVERLAY = Variant("overlay", "custom", "ring-transport")
SCHEMA = "sparkring.benchmark.serving/2"
OFF_RING_COUNTERS = ("all_reduce.fallback", "all_reduce.stock")
# vLLM's own lines that say which distributed backend and communicator its workers use.
BACKEND_LINE = re.compile(r"backend=\w+|SHM communicator disabled for group tp[^\n]*")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

STOCK = {
    "sim": (Variant("stock-management", "disabled", "management"), Variant("stock-ring", "disabled", "ring")),
    "loopback": (Variant("stock-loopback", "disabled", "loopback"),),
}


def schedule(stock: tuple[Variant, ...], per_side: int) -> list[Variant]:
    """stock, overlay, stock, overlay, ...: each stock variant `per_side` times, in turn."""
    order: list[Variant] = []
    for i in range(per_side * len(stock)):
        order += [stock[i % len(stock)], OVERLAY]
    return order


def ring_all_reduces(dumps: list[dict]) -> dict[int, int]:
    """Each rank's all-reduces carried by the ring, from its worker's flight-recorder dump. Fails when
    a worker is not in custom mode or any all-reduce left the ring: the figures would be partly stock's."""
    off_ring = {d["rank"]: d["mode"] for d in dumps if d["mode"] != "custom"}
    off_ring |= {d["rank"]: k for d in dumps for k in d["counters"] if k in OFF_RING_COUNTERS}
    if off_ring or not dumps:
        raise RuntimeError(
            f"the overlay side did not run every all-reduce on the ring: {off_ring or 'no dumps'}"
        )
    return {d["rank"]: d["counters"].get("all_reduce.ring", 0) for d in dumps}


def flight_recorders(dumps: dict[str, dict]) -> dict:
    """What carried the overlay side's collectives, from each rank's flight-recorder dump (by host):
    its mode, how many collectives it recorded and on which path (the counters, `op.path`), and the
    all-reduces on the ring per rank (refused when any left it: see `ring_all_reduces`)."""
    return {
        "flight_recorder": {
            host: {key: dump[key] for key in ("rank", "mode", "collectives", "counters")}
            for host, dump in sorted(dumps.items())
        },
        "ring_all_reduces_per_rank": ring_all_reduces(list(dumps.values())),
    }


def backend_lines(log: str) -> list[str]:
    """vLLM's log lines that name its distributed backend (and why it is not shared memory)."""
    found = []
    for line in ANSI.sub("", log).splitlines():
        if BACKEND_LINE.search(line) and line.strip() not in found:
            found.append(line.strip()[-300:])
    return found[:4]


def require_gloo(lines_by_rank: dict[str, list[str]]) -> None:
    """Stock must say it runs gloo on every rank: otherwise we do not know what we measured."""
    missing = [rank for rank, lines in lines_by_rank.items() if not any("backend=gloo" in x for x in lines)]
    if missing:
        raise RuntimeError(f"no 'backend=gloo' line from vLLM on {missing}: {lines_by_rank}")


def deployments_log(out: Path) -> Path:
    return out.with_name(f"{out.stem}-deployments.jsonl")


def current_run(log: Path, plan: dict) -> tuple[str, list[dict]]:
    """The run this call continues (the log's last, unfinished, with the same plan and no failed
    deployment: measuring that one again would replace its failure) or a new one."""
    records = load_runs(log)
    if records:
        last = records[-1]
        run = [r for r in records if r["run_id"] == last["run_id"]]
        if last["plan"] == plan and len(run) < len(plan["order"]) and not any("failed" in r for r in run):
            return last["run_id"], run
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}", []


def summarize(run: list[dict], plan: dict, cores: int) -> dict:
    """The results of one complete run: per side every round, medians, ratios to the best stock."""

    def side(name: str) -> dict:
        deployments = [r for r in run if r["variant"] == name]
        rounds = [x for r in deployments for x in r["rounds"]]
        return {
            "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rounds),
            "prefill_tok_s": statistics.median(x["prefill_tok_s"] for x in rounds),
            "decode_tok_s_rounds": [x["decode_tok_s"] for x in rounds],
            "prefill_tok_s_rounds": [x["prefill_tok_s"] for x in rounds],
            "load_avg_1m_rounds": [x["load_avg_before"]["1m"] for x in rounds],
            "over_core_count_rounds": [x["load_avg_before"]["1m"] > cores for x in rounds],
            "deployments": [
                {key: r[key] for key in ("index", "started_utc", "launch_s", "carried_by")}
                for r in deployments
            ],
        }

    stock = {name: side(name) for name in plan["stock_variants"]}
    overlay = side(OVERLAY.name)
    best = {
        metric: max(stock, key=lambda name: stock[name][metric])
        for metric in ("decode_tok_s", "prefill_tok_s")
    }
    rounds = [x for r in run for x in r["rounds"]]
    over = [x for x in rounds if x["load_avg_before"]["1m"] > cores]
    return {
        "decode_ratio_vs_best_stock": overlay["decode_tok_s"] / stock[best["decode_tok_s"]]["decode_tok_s"],
        "prefill_ratio_vs_best_stock": overlay["prefill_tok_s"]
        / stock[best["prefill_tok_s"]]["prefill_tok_s"],
        "best_stock": {"decode": best["decode_tok_s"], "prefill": best["prefill_tok_s"]},
        "rounds_interleaved": True,
        "deployment_order": [r["variant"] for r in sorted(run, key=lambda r: r["index"])],
        "rounds_over_core_count": {"rounds": len(over), "of": len(rounds), "cores": cores},
        "stock_variants": stock,
        "overlay": overlay,
    }


def headline(doc: dict) -> str:
    over = doc["rounds_over_core_count"]
    return (
        f"decode {doc['decode_ratio_vs_best_stock']:.2f}x the best stock ({doc['best_stock']['decode']}), "
        f"prefill {doc['prefill_ratio_vs_best_stock']:.2f}x ({doc['best_stock']['prefill']}); "
        f"{over['rounds']} of {over['of']} rounds ran with a 1-minute load average above the {over['cores']} cores"
    )


def plot(doc: dict, path: Path) -> None:
    """Every round of every side (hollow: load above the cores), the medians, the ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = {**doc["stock_variants"], "overlay": doc["overlay"]}
    cores = doc["rounds_over_core_count"]["cores"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in (
        (axes[0], "decode_tok_s", "decode tok/s"),
        (axes[1], "prefill_tok_s", "prefill tok/s"),
    ):
        for x, (name, side) in enumerate(sides.items()):
            color = "#2a7ab0" if name == "overlay" else "#888888"
            for value, load in zip(side[f"{metric}_rounds"], side["load_avg_1m_rounds"], strict=True):
                ax.plot(
                    x, value, "o", markersize=5, color=color, fillstyle="none" if load > cores else "full"
                )
            ax.plot([x - 0.3, x + 0.3], [side[metric]] * 2, "-", color=color, linewidth=2)
        ax.set_xticks(range(len(sides)), list(sides), fontsize=8)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    over = doc["rounds_over_core_count"]
    fig.suptitle(
        f"overlay vs best stock: decode {doc['decode_ratio_vs_best_stock']:.2f}x, prefill "
        f"{doc['prefill_ratio_vs_best_stock']:.2f}x; deployments interleaved; bars: medians; hollow: load > "
        f"{cores} cores ({over['rounds']} of {over['of']} rounds)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(doc, indent=2) + "\n")
    tmp_out.replace(out)
    plot(doc, out.with_suffix(".png"))
