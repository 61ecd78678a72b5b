"""The memory budget: what each rank will take, against the memory of the host it runs on.

A GB10 has one memory pool for its CPU and its GPU: weights, KV cache, vLLM's own memory, the OS
and the page cache all come out of the same MemTotal, and running out freezes or resets the host
instead of failing one process. vLLM does not guard it either: with `--kv-cache-memory-bytes` it
skips its memory profiling. So preflight and the launch's plan add up every rank's terms and
refuse a profile that does not fit before anything starts. Ranks that share a kernel (the sim's
four namespaces on one machine) share that kernel's MemTotal, so they are summed per host.
The figures and their sources are in docs/launch.md ("Memory budget").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from sparkcache.store import PAGE_BUFFER_BYTES, READ_AHEAD_BYTES
from sparkring.profile import GIB, LaunchProfile

Runtime = Literal["gb10", "sim-cpu"]
# vLLM's own memory per rank besides weights and KV: activations, CUDA graphs, the sampler and
# its processes (docs/launch.md, "Memory budget", gives each figure's source).
VLLM_OVERHEAD_BYTES: dict[str, int] = {"gb10": 6 * GIB, "sim-cpu": round(2.35 * GIB)}
# The share of MemTotal left to the OS, the container engine and the page cache, once per host.
RESERVE_FRACTION = 0.08
# SparkCache's bounded host staging per rank: pages read ahead of a restore plus reused buffers.
SPARKCACHE_STAGING_BYTES = READ_AHEAD_BYTES + PAGE_BUFFER_BYTES
# The files vLLM loads weights from: safetensors when a checkpoint has them, else PyTorch files;
# only at the top of the model directory (vLLM globs there, not below).
SAFETENSORS = (".safetensors",)
PYTORCH = (".bin", ".pt", ".pth")
BUDGET_ID = "PF-MEMORY-BUDGET"


class BudgetError(ValueError):
    """The budget cannot be computed (a node's memory facts are unreadable)."""


def gib(nbytes: int | float) -> str:
    """The one rounding rule: GiB (2**30 bytes), two decimals; comparisons stay in bytes."""
    return f"{nbytes / GIB:.2f}"


@dataclass(frozen=True)
class Term:
    """One line of a rank's budget: its size and where the figure comes from."""

    name: str
    nbytes: int
    source: str
    # True where the figure is unknown at plan time (no model pinned): counted as 0 and said so.
    uncounted: bool = False

    def describe(self) -> str:
        return f"{self.name} {gib(self.nbytes)} GiB ({self.source})"


@dataclass(frozen=True)
class NodeMemory:
    """What a rank's host has: MemTotal, and the boot id that tells which ranks share a kernel."""

    rank: int
    host: str
    memtotal: int
    boot_id: str


def parse_node_memory(rank: int, host: str, text: str) -> NodeMemory:
    """`cat /proc/meminfo /proc/sys/kernel/random/boot_id` -> the rank's MemTotal and boot id."""
    memtotal = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal" and value.split()[1:] == ["kB"]:
            memtotal = int(value.split()[0]) * 1024
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    boot_id = lines[-1] if lines and ":" not in lines[-1] else ""
    if memtotal is None or not boot_id:
        raise BudgetError(
            f"rank {rank} ({host}): no MemTotal or boot id in /proc/meminfo and /proc/sys/kernel/random/boot_id"
        )
    return NodeMemory(rank=rank, host=host, memtotal=memtotal, boot_id=boot_id)


def weight_bytes(files: list[dict[str, Any]]) -> int:
    """Bytes of the files vLLM loads weights from (see SAFETENSORS/PYTORCH)."""
    top = [f for f in files if "/" not in f["path"]]
    safetensors = [f["size"] for f in top if f["path"].endswith(SAFETENSORS)]
    return sum(safetensors) if safetensors else sum(f["size"] for f in top if f["path"].endswith(PYTORCH))


def rank_terms(profile: LaunchProfile, runtime: Runtime, pins: list[dict[str, Any]]) -> list[Term]:
    """Every term one rank takes, in the order they are printed (profile bound to its world).

    Weights and draft are divided by TP: vLLM shards every layer over the TP ranks, and DCP
    reuses those ranks for the KV cache (it does not add ranks), so DCP divides no weights."""
    tp = profile.tp or 1
    by_role = {pin["role"]: pin for pin in pins}
    target = by_role.get("target")
    if target is None:
        weights = Term("weights", 0, "no model pinned: the inventory names no model_target", uncounted=True)
    else:
        size = weight_bytes(target["files"])
        weights = Term(
            "weights", math.ceil(size / tp), f"{target['name']}: {size:,} B of weight files / TP {tp}"
        )
    kv_gib = profile.geometry.kv_cache_gib
    kv_source = (
        f"KV_CACHE_GIB={kv_gib}" if profile.kv_cache_gib else f"KV_CACHE_GIB default for DCP={profile.dcp}"
    )
    kv = Term("KV cache", kv_gib * GIB, kv_source)
    overhead = Term(
        "vLLM", VLLM_OVERHEAD_BYTES[runtime], f"activations, CUDA graphs, sampler, processes on {runtime}"
    )
    draft_pin = by_role.get("draft")
    if profile.spec_method != "draft_model":
        draft = Term("draft", 0, f"SPEC_METHOD={profile.spec_method} loads no draft model")
    elif draft_pin is None:
        draft = Term("draft", 0, "no draft pinned: the inventory names no model_draft", uncounted=True)
    else:
        size = weight_bytes(draft_pin["files"])
        draft = Term(
            "draft", math.ceil(size / tp), f"{draft_pin['name']}: {size:,} B of weight files / TP {tp}"
        )
    if profile.sparkcache_enabled:
        staging = Term("SparkCache staging", SPARKCACHE_STAGING_BYTES, "restore read-ahead and page buffers")
    else:
        staging = Term("SparkCache staging", 0, "SPARKCACHE_ENABLED=0")
    return [weights, kv, overhead, draft, staging]


@dataclass(frozen=True)
class HostBudget:
    """The ranks that share one host (one kernel), and whether their terms fit its MemTotal."""

    nodes: list[NodeMemory]
    terms: list[Term]

    @property
    def memtotal(self) -> int:
        return min(node.memtotal for node in self.nodes)

    @property
    def per_rank(self) -> int:
        return sum(term.nbytes for term in self.terms)

    @property
    def reserve(self) -> Term:
        return Term(
            "OS and page-cache reserve",
            math.ceil(self.memtotal * RESERVE_FRACTION),
            f"{RESERVE_FRACTION:.0%} of MemTotal, once per host",
        )

    @property
    def need(self) -> int:
        return len(self.nodes) * self.per_rank + self.reserve.nbytes

    @property
    def fits(self) -> bool:
        return self.need <= self.memtotal

    def ranks(self) -> str:
        return ", ".join(f"r{node.rank} ({node.host})" for node in self.nodes)

    def summary(self) -> str:
        """One line: the sum term by term, against MemTotal."""
        count = len(self.nodes)
        terms = " + ".join(f"{term.name} {gib(term.nbytes)}" for term in self.terms)
        per_rank = f"{count} ranks x ({terms})" if count > 1 else terms
        verdict = (
            f"fits, {gib(self.memtotal - self.need)} GiB spare"
            if self.fits
            else f"does NOT fit, {gib(self.need - self.memtotal)} GiB short"
        )
        shared = f"{self.ranks()} share one host" if count > 1 else self.ranks()
        uncounted = [term.name for term in self.terms if term.uncounted]
        return (
            f"{shared}: {per_rank} + {self.reserve.name} {gib(self.reserve.nbytes)} = {gib(self.need)} GiB "
            f"of MemTotal {gib(self.memtotal)} GiB: {verdict}"
            + (f" ({' and '.join(uncounted)} not counted)" if uncounted else "")
        )

    def largest_kv_gib(self, profile: LaunchProfile) -> int:
        """The largest whole KV_CACHE_GIB that would fit with every other term as it is."""
        kv = profile.geometry.kv_cache_gib * GIB
        room = (self.memtotal - self.reserve.nbytes) // len(self.nodes) - (self.per_rank - kv)
        return max(room // GIB, 0)


def host_budgets(
    profile: LaunchProfile, runtime: Runtime, pins: list[dict[str, Any]], nodes: list[NodeMemory]
) -> list[HostBudget]:
    """One budget per host: ranks grouped by boot id, ordered by their lowest rank."""
    terms = rank_terms(profile, runtime, pins)
    groups: dict[str, list[NodeMemory]] = {}
    for node in sorted(nodes, key=lambda n: n.rank):
        groups.setdefault(node.boot_id, []).append(node)
    return [HostBudget(nodes=group, terms=terms) for group in groups.values()]


def refusal(profile: LaunchProfile, budget: HostBudget) -> str:
    """Why this host's ranks cannot start, every term in GiB, and what to change."""
    count = len(budget.nodes)
    terms = "; ".join(term.describe() for term in budget.terms)
    per_rank = f"per rank {gib(budget.per_rank)} GiB x {count} ranks on this host" if count > 1 else ""
    largest = budget.largest_kv_gib(profile)
    kv_fix = (
        f"lower KV_CACHE_GIB to {largest} or less (now {profile.geometry.kv_cache_gib}), and MAX_MODEL_LEN "
        "with it if one full-length request no longer fits the smaller KV cache"
        if largest >= 1
        else "KV_CACHE_GIB cannot go low enough on its own"
    )
    return (
        f"memory budget of {budget.ranks()}: {terms}"
        f"{'; ' + per_rank if per_rank else ''}; {budget.reserve.describe()}: needs {gib(budget.need)} GiB, "
        f"MemTotal is {gib(budget.memtotal)} GiB ({gib(budget.need - budget.memtotal)} GiB short). "
        f"Fix: {kv_fix}; or serve another quantization (smaller weight files); or spread TP over more ranks"
        + (" on more hosts" if count > 1 else "")
    )


def budget_report(
    profile: LaunchProfile,
    runtime: Runtime,
    pins: list[dict[str, Any]],
    nodes: list[NodeMemory],
    world_size: int,
) -> dict[str, Any]:
    """The plan's view: one line per host, one preflight check per rank with memory facts, and the
    refusals. A term unknown at plan time (no model named) is not counted and said so; what does
    not fit without it is still refused."""
    bound = profile.for_world(world_size)
    budgets = host_budgets(bound, runtime, pins, nodes)
    terms = rank_terms(bound, runtime, pins)
    uncounted = [f"{term.name} not counted ({term.source})" for term in terms if term.uncounted]
    checks: dict[str, dict[str, Any]] = {}
    refusals = []
    for budget in budgets:
        reason = "" if budget.fits else refusal(bound, budget)
        if reason:
            refusals.append(reason)
        for node in budget.nodes:
            checks[str(node.rank)] = {
                "id": BUDGET_ID,
                "status": "pass" if budget.fits else "fail",
                "domain": "memory",
                "subject": f"r{node.rank}",
                "detail": "; ".join([budget.summary(), *uncounted]),
                "fix": reason.partition("Fix: ")[2],
            }
    lines = [f"per rank: {'; '.join(term.describe() for term in terms)}"]
    lines += [budget.summary() for budget in budgets]
    return {
        "fits": not refusals,
        "complete": not uncounted,
        "lines": lines,
        "checks": checks,
        "refusals": refusals,
    }
