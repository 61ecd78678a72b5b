"""Controller-side filters of the status view (playbooks/status.yml): the document and its page."""

from __future__ import annotations

from typing import Any

from sparkring.status import build_status, render_text


def sparkring_status(
    results: list[dict[str, Any]],
    ranks: list[int],
    hosts: list[str],
    inventory: str,
    cluster: str,
    time_utc: str,
    burn: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every rank's `sparkring_rank_status` result, with the ranks and hosts in the same order ->
    the status document."""
    entries = [
        {**result, "rank": int(rank), "host": host}
        for result, rank, host in zip(results, ranks, hosts, strict=True)
    ]
    return build_status(entries, inventory, cluster, time_utc, burn or None, agent or None)


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {"sparkring_status": sparkring_status, "sparkring_status_text": render_text}
