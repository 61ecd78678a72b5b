"""Controller-side filter: the memory budget of every rank (preflight and the launch's plan).

It only calls `sparkring.memory_budget.budget_report` (the one budget), fed by the launch profile,
the pinned models (`sparkring_model_pins`, the one join) and each rank's memory facts, so that
preflight and the launch refuse the same profile with the same words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring.launch_spec import RUNTIME
from sparkring.memory_budget import BudgetError, budget_report, parse_node_memory
from sparkring.profile import ProfileError, load_profile_file


def sparkring_memory_budget(
    profile_path: str, flavor: str, pins: list, nodes: list, world_size: int
) -> dict[str, Any]:
    """`{{ profile | sparkring_memory_budget(image_flavor, pins, nodes, world_size) }}`

    `nodes`: one `{rank, host, meminfo}` per rank that answered, `meminfo` being the output of
    `cat /proc/meminfo /proc/sys/kernel/random/boot_id` on it. Returns `fits`, `complete` (every
    term known), `lines` (what the plan prints), `checks` (rank -> a PF-MEMORY-BUDGET result) and
    `refusals` (one line per host that does not fit, every term in GiB and the fix). The flavor's
    runtime (launch_spec.RUNTIME: gb10 or sim-cpu) says whose vLLM overhead counts."""
    if flavor not in RUNTIME:
        raise AnsibleFilterError(
            f"sparkring_memory_budget: image_flavor {flavor!r}, expected one of {', '.join(RUNTIME)}"
        )
    if not Path(profile_path).is_file():
        raise AnsibleFilterError(f"sparkring_memory_budget: launch profile {profile_path} does not exist")
    try:
        profile = load_profile_file(profile_path)
        memory = [parse_node_memory(int(n["rank"]), str(n["host"]), str(n["meminfo"])) for n in nodes]
        return budget_report(profile, RUNTIME[flavor], list(pins), memory, int(world_size))
    except (ProfileError, BudgetError) as error:
        raise AnsibleFilterError(f"memory budget: {error}") from None


class FilterModule:
    """Ansible's entry point for this file's filters."""

    def filters(self) -> dict[str, Any]:
        return {"sparkring_memory_budget": sparkring_memory_budget}
