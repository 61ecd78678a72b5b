"""AC-CELLS (plugins/sparkring/acceptance_cells.py): cell validation, prompts, figures, ring audit, plot."""

from __future__ import annotations

import json

import pytest
from sparkring import acceptance_cells as cells
from sparkring.acceptance import AcceptanceError

DECODE_C8 = {
    "id": "c8",
    "kind": "decode",
    "prompt_tokens": 256,
    "max_tokens": 16,
    "requests": 8,
    "concurrency": 8,
    "shared_prefix": True,
    "target_tok_s": 63.6,
}


def test_every_bad_cell_is_named_with_its_field() -> None:
    raw = [
        {"id": "a", "kind": "prefill", "prompt_tokens": 2000, "max_tokens": 100},
        {"id": "b", "kind": "decode", "prompt_tokens": 10, "max_tokens": 1},
        {"id": "c", "kind": "sideways", "prompt_tokens": 10, "max_tokens": 4},
        {"id": "d", "kind": "decode", "prompt_tokens": 10, "max_tokens": 4, "requests": 3, "concurrency": 2},
        {"id": "a", "kind": "prefill", "prompt_tokens": 10, "max_tokens": 1, "colour": "red"},
        {"id": "e", "kind": "prefill", "prompt_tokens": "10", "max_tokens": 1},
    ]
    with pytest.raises(AcceptanceError) as error:
        cells.parse_cells(raw, max_model_len=2048)
    lines = str(error.value).splitlines()
    assert (
        lines[0]
        == "acceptance_cells[0] (a): 2000 prompt + 100 generated tokens exceed MAX_MODEL_LEN 2048 of the launch profile"
    )
    assert lines[1].startswith(
        "acceptance_cells[1] (b).cell: Value error, a decode cell needs max_tokens >= 2"
    )
    assert lines[2].startswith("acceptance_cells[2] (c).kind: Input should be 'prefill' or 'decode'")
    assert "requests (3) must be a multiple of concurrency (2)" in lines[3]
    assert lines[4].startswith("acceptance_cells[4] (a).colour: Extra inputs are not permitted")
    assert lines[5].startswith("acceptance_cells[5] (e).prompt_tokens: Input should be a valid integer")
    assert len(lines) == 6


def test_prompts_are_exact_lengths_inside_the_vocabulary_and_new_every_run() -> None:
    (cell,) = cells.parse_cells([DECODE_C8], max_model_len=2048)
    first = cells.cell_requests(cell, "20261201T120000Z", vocab_size=1024)
    assert [len(r["prompt"]) for r in first] == [256] * 8
    low, high = cells.token_range(1024)
    assert all(low <= t < high for r in first for t in r["prompt"])
    prefixes = {tuple(r["prompt"][:240]) for r in first}
    suffixes = {tuple(r["prompt"][240:]) for r in first}
    assert len(prefixes) == 1 and len(suffixes) == 8  # one shared prefix, every stream its own end
    assert cells.cell_requests(cell, "20261201T120000Z", 1024) == first
    assert cells.cell_requests(cell, "20261201T120001Z", 1024)[0]["prompt"] != first[0]["prompt"]
    long = cells.long_prompts(2, 600, 16, "s", 1024, 2048)
    assert [len(r["prompt"]) for r in long] == [600, 600] and long[0]["prompt"] != long[1]["prompt"]
    assert all(r["ignore_eos"] is False for r in long)


def stream(i: int, rnd: int, start: float, first: float, end: float, n: int, prompt: int = 256) -> dict:
    return {
        "id": f"c8-{i}",
        "round": rnd,
        "started": start,
        "first_token": first,
        "ended": end,
        "ttft_s": first - start,
        "total_s": end - start,
        "prompt_tokens": prompt,
        "completion_tokens": n,
        "text": "",
        "error": None,
    }


def test_a_concurrent_decode_cell_reports_the_round_aggregate() -> None:
    (cell,) = cells.parse_cells([DECODE_C8], max_model_len=2048)
    results = [stream(i, 0, 0.0, 0.5 + 0.1 * i, 2.5, 16) for i in range(8)]
    figures = cells.cell_figures(cell, results)
    # 8 streams x 15 tokens after the first, decoded between the first first-token (0.5 s) and the end (2.5 s)
    assert figures["headline"]["metric"] == "aggregate_decode_tok_s"
    assert figures["headline"]["p50"] == pytest.approx(60.0)
    assert figures["vs_target"] == pytest.approx(60.0 / 63.6, abs=1e-4)
    assert figures["ttft_s"]["min"] == pytest.approx(0.5) and figures["ttft_s"]["max"] == pytest.approx(1.2)
    assert figures["errors"] == []


def test_single_stream_cells_report_per_request_figures_and_count_errors() -> None:
    (prefill, decode) = cells.parse_cells(
        [
            {"id": "p", "kind": "prefill", "prompt_tokens": 512, "max_tokens": 1},
            {"id": "d", "kind": "decode", "prompt_tokens": 256, "max_tokens": 33},
        ],
        max_model_len=2048,
    )
    p = cells.cell_figures(
        prefill, [stream(i, i, 0, 0.25 * (i + 1), 0.25 * (i + 1), 1, 512) for i in range(3)]
    )
    assert p["headline"]["values"] == [2048.0, 1024.0, 682.6667] and p["headline"]["p50"] == 1024.0
    failed = {**stream(2, 2, 0, 1, 1, 0), "error": "HTTP 400: too long", "first_token": None}
    d = cells.cell_figures(decode, [stream(0, 0, 0, 0.2, 1.2, 33), stream(1, 1, 0, 0.2, 2.2, 33), failed])
    assert d["headline"]["values"] == [32.0, 16.0]
    assert d["errors"] == [{"id": "c8-2", "error": "HTTP 400: too long"}]


def test_ring_audit_per_rank() -> None:
    before = {"all_reduce.ring": 100, "all_gather.ring": 10}
    on_ring = {"all_reduce.ring": 150, "all_gather.ring": 12}
    audit, problems = cells.ring_audit(1, "custom", before, on_ring, 0.0)
    assert (audit["status"], audit["ring"], audit["off_ring_share"], problems) == ("pass", 52, 0.0, [])
    _, problems = cells.ring_audit(2, "custom", before, {**on_ring, "all_reduce.fallback": 4}, 0.0)
    assert problems == ["rank 2: 4 of 56 collectives left the ring (budget 0.0%)"]
    assert cells.ring_audit(2, "custom", before, {**on_ring, "all_reduce.fallback": 4}, 0.1)[1] == []
    assert cells.ring_audit(3, "custom", before, before, 0.0)[1] == [
        "rank 3: the ring carried no collective during the cell (custom mode)"
    ]
    _, problems = cells.ring_audit(0, "shadow", before, {**on_ring, "all_reduce.shadow_mismatch": 1}, 0.0)
    assert problems == ["rank 0: 1 shadow comparison(s) disagreed with stock"]
    assert cells.ring_audit(0, "disabled", None, None, 0.0) == (
        {"mode": "disabled", "status": "not applicable"},
        [],
    )
    assert cells.ring_audit(0, "custom", None, on_ring, 0.0)[1] == [
        "rank 0: no flight-recorder dump around the cell"
    ]


def test_cells_verdict_names_the_api_rank_for_request_errors_and_the_rank_off_the_ring(tmp_path) -> None:
    ok = {"all_reduce.ring": 10}
    entry = {
        "cell": DECODE_C8,
        "results": [stream(i, 0, 0.0, 0.5, 2.5, 16) for i in range(8)],
        "head_rank": 0,
        "dumps": {str(r): {"mode": "custom", "before": {}, "after": ok} for r in range(4)},
    }
    verdict = cells.cells_verdict([entry], 0.0)
    assert verdict["status"] == "pass", verdict["problems"]
    entry["results"][3] = {**entry["results"][3], "error": "HTTP 500: engine dead"}
    entry["dumps"]["2"]["after"] = {**ok, "all_gather.stock": 1}
    verdict = cells.cells_verdict([entry], 0.0)
    assert verdict["failing_ranks"] == [0, 2]
    assert (
        verdict["problems"][0]
        == "cell c8: 1 of 8 requests failed (the API on rank 0): c8-3: HTTP 500: engine dead"
    )
    assert verdict["problems"][1] == "cell c8: rank 2: 1 of 11 collectives left the ring (budget 0.0%)"
    (tmp_path / "AC-CELLS.json").write_text(json.dumps(verdict))
    assert cells.plot(tmp_path).stat().st_size > 10_000
