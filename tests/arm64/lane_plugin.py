"""pytest plugin of the aarch64 lane (tests/arm64/run.sh loads it with -p lane_plugin).

The lane's root has no torch (the CUDA torch for aarch64 needs wheels this index lacks, issue 25),
so a test module that imports torch at its top cannot be collected there. Such a module is
reported as skipped with that reason; any other collection error still fails the lane. Tests
that time a process rather than check what the CPU computes are skipped under emulation, each
with its reason.
"""

from __future__ import annotations

import pytest

NO_TORCH = "torch is not in the arm64 lane's root"
# A 4 MB burn step under a 3 s collective bound: emulated (and niced beside other work) a step can
# outlast the bound before the fault is injected, which is speed, not what the CPU computes.
SLOW_BURN = (
    "its 4 MB all-reduce steps run under a 3 s collective bound; emulated, a step can outlast it "
    "before the fault is injected (seen once: 'a rank died before the fault was injected')"
)
TIMED = {
    "tests/unit/transport/test_transport_faults.py::test_killed_rank_makes_every_survivor_fail_naming_a_peer[4MB-28652]": SLOW_BURN,
    "tests/unit/transport/test_transport_faults.py::test_stalled_rank_times_out_its_neighbours[4MB-28662]": SLOW_BURN,
    "tests/unit/sparkcache/test_sparkcache_store.py::test_kill_9_during_publication_leaves_only_verified_snapshots": (
        "kills its writer 0.3-1.2 s after the start; under emulation the writer's Python has not "
        "started publishing by then (measured: 0 pages in 8 kills), which is speed, not the CPU"
    ),
}


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    if (
        report.failed
        and isinstance(collector, pytest.Module)
        and "No module named 'torch'" in str(report.longrepr)
    ):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {NO_TORCH}")
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid in TIMED:
            item.add_marker(pytest.mark.skip(reason=f"emulated: {TIMED[item.nodeid]}"))
