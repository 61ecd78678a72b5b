"""Controller-side filters of the acceptance role: the plan, the cells' requests and every gate's
verdict, all from `sparkring.acceptance` and `sparkring.acceptance_cells` (the one place each
gate's rule lives); the role only collects and writes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring import acceptance, acceptance_cells
from sparkring.lock import LOCK_PATH, load_lock

from sparkcache import CHUNK_TOKENS


def _plain(value: Any) -> Any:
    """Ansible hands over lazy, tagged values: plain JSON types for the pure functions."""
    return json.loads(json.dumps(value, default=str))


def _guard(call):
    def wrapped(*args, **kwargs):
        try:
            return call(*_plain(args), **_plain(kwargs))
        except acceptance.AcceptanceError as error:
            raise AnsibleFilterError(str(error)) from None

    wrapped.__doc__ = call.__doc__
    return wrapped


def plan(selected: list[str] | None, profile: dict[str, Any]) -> list[dict[str, Any]]:
    return acceptance.plan(selected, profile)


def cells(raw: list[dict[str, Any]], max_model_len: int, seed: str, vocab_size: int) -> list[dict[str, Any]]:
    """The validated cells with their requests: [{cell, requests}]."""
    return [
        {"cell": cell.model_dump(), "requests": acceptance_cells.cell_requests(cell, seed, vocab_size)}
        for cell in acceptance_cells.parse_cells(raw, max_model_len)
    ]


def lock_verdict(
    ranks: list[dict[str, Any]], profile: dict[str, Any], identity: dict[str, Any]
) -> dict[str, Any]:
    lock_sha256 = hashlib.sha256(LOCK_PATH.read_bytes()).hexdigest()
    return acceptance.lock_verdict(load_lock().model_dump(mode="json"), lock_sha256, profile, identity, ranks)


def sparkcache_verdict(cold, warm, logs, prompt_lengths: list[int]) -> dict[str, Any]:
    expected = [(n - 1) // CHUNK_TOKENS * CHUNK_TOKENS for n in prompt_lengths]
    return acceptance.sparkcache_verdict(cold, warm, {int(k): v for k, v in logs.items()}, expected)


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "sparkring_acceptance_plan": _guard(plan),
            "sparkring_acceptance_cells": _guard(cells),
            "sparkring_acceptance_long_prompts": _guard(acceptance_cells.long_prompts),
            "sparkring_acceptance_pinned_model_files": _guard(acceptance.pinned_model_files),
            "sparkring_acceptance_lock": _guard(lock_verdict),
            "sparkring_acceptance_site_check": _guard(acceptance.site_check_verdict),
            "sparkring_acceptance_burn": _guard(acceptance.burn_verdict),
            "sparkring_acceptance_nccl": _guard(acceptance.nccl_identity_verdict),
            "sparkring_acceptance_determinism_requests": _guard(acceptance.determinism_requests),
            "sparkring_acceptance_determinism": _guard(acceptance.determinism_verdict),
            "sparkring_acceptance_sparkcache": _guard(sparkcache_verdict),
            "sparkring_acceptance_cells_verdict": _guard(acceptance_cells.cells_verdict),
            "sparkring_acceptance_skipped": _guard(acceptance.skipped),
            "sparkring_acceptance_summary": _guard(acceptance.summary_text),
            "sparkring_acceptance_failure_line": _guard(acceptance.failure_line),
        }
