"""AC-CELLS: benchmark cells through the OpenAI API, their figures, the ring audit and the plot.

A cell is a fixed load (prompt length, tokens to generate, streams at once, how many requests):
``prefill`` cells report prompt tokens per second of time to first token, ``decode`` cells
report generated tokens per second after the first token (one stream), or, with several
streams at once, the aggregate of a round: every stream's tokens after its first over the window
in which they decoded. Prompts are random token ids, new every run (nothing cached from an
earlier run, SparkCache included), so a prefill cell measures an uncached prefill.

Every cell is audited from every rank's flight recorder (dumped before and after it): in
``custom`` mode the ring must have carried the collectives, at most ``budget`` of them on stock or
fallback; in ``shadow`` mode every comparison must have matched.

    python -m sparkring.acceptance_cells plot EVIDENCE_DIR    # cells.png from AC-CELLS.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, model_validator

from sparkring.acceptance import AcceptanceError, result

SHARED_SUFFIX_TOKENS = 16  # shared-prefix cells: every stream ends with its own tokens


class Cell(BaseModel):
    """One cell of the acceptance profile (``acceptance_cells``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    kind: Literal["prefill", "decode"]
    prompt_tokens: int
    max_tokens: int
    requests: int = 3
    concurrency: int = 1
    shared_prefix: bool = False
    target_tok_s: float | None = None

    @model_validator(mode="after")
    def _sizes(self) -> Cell:
        for name in ("prompt_tokens", "max_tokens", "requests", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.requests % self.concurrency:
            raise ValueError(
                f"requests ({self.requests}) must be a multiple of concurrency ({self.concurrency})"
            )
        if self.kind == "decode" and self.max_tokens < 2:
            raise ValueError("a decode cell needs max_tokens >= 2 (tokens after the first)")
        if self.shared_prefix and self.prompt_tokens <= SHARED_SUFFIX_TOKENS:
            raise ValueError(f"a shared-prefix cell needs more than {SHARED_SUFFIX_TOKENS} prompt tokens")
        return self

    @property
    def headline(self) -> str:
        if self.kind == "prefill":
            return "prefill_tok_s"
        return "aggregate_decode_tok_s" if self.concurrency > 1 else "decode_tok_s"


def parse_cells(raw: list[dict[str, Any]], max_model_len: int) -> list[Cell]:
    """Validate the cells, each problem naming the cell and the field; every cell must fit the
    profile's MAX_MODEL_LEN (a request vLLM refuses is a configuration error, found before any gate)."""
    cells, problems = [], []
    for index, item in enumerate(raw):
        where = f"acceptance_cells[{index}]" + (f" ({item.get('id')})" if isinstance(item, dict) else "")
        try:
            cell = Cell.model_validate(item)
        except ValidationError as error:
            problems += [
                f"{where}.{'.'.join(map(str, e['loc'])) or 'cell'}: {e['msg']}" for e in error.errors()
            ]
            continue
        if cell.prompt_tokens + cell.max_tokens > max_model_len:
            problems.append(
                f"{where}: {cell.prompt_tokens} prompt + {cell.max_tokens} generated tokens exceed "
                f"MAX_MODEL_LEN {max_model_len} of the launch profile"
            )
        cells.append(cell)
    ids = [c.id for c in cells]
    problems += [
        f"acceptance_cells: id {i!r} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})
    ]
    if problems:
        raise AcceptanceError("\n".join(problems))
    return cells


def token_range(vocab_size: int) -> tuple[int, int]:
    """Token ids away from both ends of the vocabulary (special tokens live there)."""
    margin = max(1, min(1000, vocab_size // 10))
    return margin, vocab_size - margin


def cell_requests(cell: Cell, seed: str, vocab_size: int) -> list[dict[str, Any]]:
    """The cell's requests with their prompts (random token ids from ``seed``)."""
    low, high = token_range(vocab_size)

    def ids(tag: str, n: int) -> list[int]:
        rng = random.Random(f"{seed}/{cell.id}/{tag}")
        return [rng.randrange(low, high) for _ in range(n)]

    prefix = ids("prefix", cell.prompt_tokens - SHARED_SUFFIX_TOKENS) if cell.shared_prefix else []
    out = []
    for i in range(cell.requests):
        prompt = (
            prefix + ids(str(i), SHARED_SUFFIX_TOKENS)
            if cell.shared_prefix
            else ids(str(i), cell.prompt_tokens)
        )
        out.append(
            {"id": f"{cell.id}-{i}", "prompt": prompt, "max_tokens": cell.max_tokens, "ignore_eos": True}
        )
    return out


def long_prompts(
    count: int, prompt_tokens: int, max_tokens: int, seed: str, vocab_size: int, max_model_len: int
) -> list[dict[str, Any]]:
    """AC-SPARKCACHE's long prompts: random token ids (nothing cached yet), plain greedy output."""
    raw = {
        "id": "sparkcache",
        "kind": "prefill",
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "requests": count,
    }
    (cell,) = parse_cells([raw], max_model_len)
    return [{**r, "ignore_eos": False} for r in cell_requests(cell, seed, vocab_size)]


def spread(values: Iterable[float]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "p50": None, "min": None, "max": None, "values": []}
    return {
        "n": len(vals),
        "p50": round(statistics.median(vals), 4),
        "min": round(min(vals), 4),
        "max": round(max(vals), 4),
        "values": [round(v, 4) for v in vals],
    }


def cell_figures(cell: Cell, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per request and per round figures, the headline with its spread, against the target."""
    ok = [r for r in results if not r.get("error")]
    per_request = []
    for r in ok:
        decode_s = r["total_s"] - r["ttft_s"]
        per_request.append(
            {
                "id": r["id"],
                "round": r["round"],
                "ttft_s": r["ttft_s"],
                "prompt_tokens": r["prompt_tokens"],
                "completion_tokens": r["completion_tokens"],
                "prefill_tok_s": r["prompt_tokens"] / r["ttft_s"] if r["ttft_s"] > 0 else None,
                "decode_tok_s": (r["completion_tokens"] - 1) / decode_s
                if r["completion_tokens"] > 1 and decode_s > 0
                else None,
            }
        )
    rounds = []
    for number in sorted({r["round"] for r in ok}):
        members = [r for r in ok if r["round"] == number and r.get("first_token") is not None]
        window = max((r["ended"] for r in members), default=0) - min(
            (r["first_token"] for r in members), default=0
        )
        tokens = sum(r["completion_tokens"] - 1 for r in members)
        rounds.append(
            {
                "round": number,
                "streams": len(members),
                "aggregate_decode_tok_s": tokens / window if window > 0 else None,
            }
        )
    source = rounds if cell.headline == "aggregate_decode_tok_s" else per_request
    headline = spread(item[cell.headline] for item in source)
    figures = {
        "cell": cell.model_dump(),
        "requests": len(results),
        "errors": [{"id": r["id"], "error": r["error"]} for r in results if r.get("error")],
        "headline": {"metric": cell.headline, **headline},
        "ttft_s": spread(r["ttft_s"] for r in per_request),
        "prompt_tokens": spread(r["prompt_tokens"] for r in per_request),
        "completion_tokens": spread(r["completion_tokens"] for r in per_request),
        "per_request": per_request,
        "rounds": rounds,
    }
    if cell.target_tok_s and headline["p50"]:
        figures["vs_target"] = round(headline["p50"] / cell.target_tok_s, 4)
    return figures


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(set(before) | set(after))
        if after.get(k, 0) != before.get(k, 0)
    }


def ring_audit(
    rank: int, mode: str | None, before: dict[str, int] | None, after: dict[str, int] | None, budget: float
) -> tuple[dict[str, Any], list[str]]:
    """One rank's collectives during one cell, from its worker's recorder dumps before and after."""
    if mode in (None, "disabled"):
        return {"mode": mode or "disabled", "status": "not applicable"}, []
    if before is None or after is None:
        return {"mode": mode, "status": "no dump"}, [f"rank {rank}: no flight-recorder dump around the cell"]
    delta = counter_delta(before, after)

    def total(suffix: str) -> int:
        return sum(v for k, v in delta.items() if k.endswith(suffix))

    ring, off, errors = total(".ring"), total(".stock") + total(".fallback"), total(".error")
    audit = {
        "mode": mode,
        "delta": delta,
        "ring": ring,
        "off_ring": off,
        "errors": errors,
        "mismatches": total(".shadow_mismatch"),
        "off_ring_share": round(off / (ring + off), 6) if ring + off else None,
    }
    problems = []
    if errors:
        problems.append(f"rank {rank}: {errors} collective(s) failed on the ring during the cell")
    if ring == 0:
        problems.append(f"rank {rank}: the ring carried no collective during the cell ({mode} mode)")
    if mode == "custom" and ring and off / (ring + off) > budget:
        problems.append(f"rank {rank}: {off} of {ring + off} collectives left the ring (budget {budget:.1%})")
    if mode == "shadow" and audit["mismatches"]:
        problems.append(f"rank {rank}: {audit['mismatches']} shadow comparison(s) disagreed with stock")
    audit["status"] = "fail" if problems else "pass"
    return audit, problems


def cells_verdict(cells: list[dict[str, Any]], budget: float) -> dict[str, Any]:
    """``cells[i]``: cell (as configured), results (sparkring_completions), head_rank, and dumps:
    {rank: {"mode", "before", "after"}} (counters or None)."""
    problems: dict[int | None, list[str]] = {}
    evidence = []
    for entry in cells:
        cell = Cell.model_validate(entry["cell"])
        figures = cell_figures(cell, entry["results"])
        if figures["errors"]:
            head = entry["head_rank"]
            first = figures["errors"][0]
            problems.setdefault(head, []).append(
                f"cell {cell.id}: {len(figures['errors'])} of {figures['requests']} requests failed "
                f"(the API on rank {head}): {first['id']}: {first['error']}"
            )
        audits = {}
        for rank, dump in sorted(entry["dumps"].items(), key=lambda kv: int(kv[0])):
            audits[int(rank)], found = ring_audit(
                int(rank), dump.get("mode"), dump.get("before"), dump.get("after"), budget
            )
            problems.setdefault(int(rank), []).extend(f"cell {cell.id}: {p}" for p in found)
        evidence.append({**figures, "ring_audit": audits})
    line = "; ".join(
        f"{e['cell']['id']} {e['headline']['metric']} p50 {e['headline']['p50']}" for e in evidence
    )
    return result(
        "AC-CELLS",
        problems,
        line or "no cells",
        "a failed request: the message above is vLLM's (API on rank 0); collectives off the ring: that "
        "rank's flight recorder dump in the evidence folder names the op and the path",
        {"budget": budget, "cells": evidence},
    )


def plot(evidence_dir: Path) -> Path:
    """cells.png: per cell, the headline figure and the time to first token of every request."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = json.loads((evidence_dir / "AC-CELLS.json").read_text())["evidence"]["cells"]
    fig, axes = plt.subplots(2, max(1, len(cells)), figsize=(3.2 * max(1, len(cells)), 6), squeeze=False)
    for column, cell in enumerate(cells):
        head, ttft = cell["headline"], cell["ttft_s"]
        for row, (stats, label) in enumerate(
            ((head, head["metric"].replace("_", " ")), (ttft, "time to first token (s)"))
        ):
            ax = axes[row][column]
            ax.scatter(
                range(len(stats["values"])), stats["values"], s=18, color="tab:blue", label="request/round"
            )
            if stats["p50"] is not None:
                ax.axhline(stats["p50"], color="tab:blue", linewidth=1, label=f"p50 {stats['p50']:.3g}")
            if row == 0 and cell["cell"].get("target_tok_s"):
                ax.axhline(
                    cell["cell"]["target_tok_s"],
                    color="tab:red",
                    linestyle="--",
                    linewidth=1,
                    label=f"target {cell['cell']['target_tok_s']}",
                )
            ax.set_ylim(bottom=0)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6, loc="lower right")
        axes[0][column].set_title(
            f"{cell['cell']['id']}\n{cell['cell']['prompt_tokens']} in, {cell['cell']['max_tokens']} out, "
            f"C{cell['cell']['concurrency']}, {len(cell['errors'])} errors",
            fontsize=8,
        )
    fig.tight_layout()
    out = evidence_dir / "cells.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "plot":
        print("usage: python -m sparkring.acceptance_cells plot EVIDENCE_DIR", file=sys.stderr)
        return 2
    print(plot(Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
