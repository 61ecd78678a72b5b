"""SparkCache restore into GPU memory -> benchmarks/results/sparkcache_device.json (device lane).

Verified pages go to the GPU two ways, over the same bytes in the same run:
- pinned: each page is copied into one of two pinned host slots and sent with an async
  copy (cudaMemcpyAsync from page-locked memory) while the CPU fills the other slot;
- plain: each page's own (pageable) buffer is copied to the GPU directly; the driver then
  bounces it through its own staging buffer and the copy blocks the CPU.
Each is measured twice: from host memory (the copy alone) and from disk (a cold restore:
read + sha256 + copy, page cache dropped with posix_fadvise(DONTNEED) before each round), of
one long context published turn by turn and restored by one request, as in run.py.

    python3 -m benchmarks.sparkcache.gpu_restore --out OUT.json [--mib 512]
    (in a copy without .git, such as the device lane's, set SPARKRING_SOURCE_COMMIT=<sha>[+dirty])

Every run is also appended, with its provenance, to the history beside --out
(OUT-history.jsonl), so a later run adds to the record instead of replacing it.

Needs torch with CUDA and a GPU; prints a reason and exits 0 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks.history import append_run, history_path
from benchmarks.provenance import RunProvenance
from benchmarks.sparkcache import run

try:
    import torch
except ImportError:  # the CPU lanes: gpu_missing_reason says so
    torch = None

from sparkcache.pages import Buffer, PageError
from sparkcache.store import READ_WORKERS, SparkCacheStore, StoreLimits


def gpu_missing_reason() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


class PinnedStager:
    """Host bytes -> GPU through `slots` pinned buffers: the copy engine drains one slot while
    the CPU fills the next, and a slot is refilled only after its last copy finished.

    A slot is filled by a plain memcpy through a memoryview, not `Tensor.copy_`: torch's
    intra-op thread pool would then spin on every core the sha256 readers need.
    """

    def __init__(self, slot_bytes: int, device: torch.device, slots: int = 2) -> None:
        self._slots = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self._views = [
            memoryview((ctypes.c_ubyte * slot_bytes).from_address(t.data_ptr())).cast("B")
            for t in self._slots
        ]
        self._copied = [torch.cuda.Event() for _ in range(slots)]
        self._stream = torch.cuda.Stream(device)
        self._next = 0

    def copy(self, payload: Buffer, dest: torch.Tensor) -> None:
        """Queue `payload` -> `dest` (a uint8 GPU tensor of its size); returns before it lands."""
        i = self._next % len(self._slots)
        self._next += 1
        self._copied[i].synchronize()  # never overwrite bytes still on their way
        n = dest.numel()
        self._views[i][:n] = payload
        self._stream.wait_stream(torch.cuda.current_stream())  # after whatever made `dest`
        with torch.cuda.stream(self._stream):
            dest.copy_(self._slots[i][:n], non_blocking=True)
            self._copied[i].record()

    def finish(self) -> None:
        self._stream.synchronize()


def plain_copy(payload: Buffer, dest: torch.Tensor) -> None:
    dest.copy_(torch.frombuffer(payload, dtype=torch.uint8))


def restore_to_gpu(
    store: SparkCacheStore,
    keys: list[str],
    dest: torch.Tensor,
    copy: Callable[[Buffer, torch.Tensor], None],
) -> int:
    """Copy the verified pages of `keys` one after the other into `dest`; stop at the first
    page that fails verification (its bytes never reach the GPU). Returns pages copied."""
    offset = copied = 0
    for page in store.read_pages(keys):
        if isinstance(page, PageError):
            break
        n = memoryview(page.payload).nbytes
        copy(page.payload, dest[offset : offset + n])
        offset += n
        copied += 1
    return copied


def gbps(nbytes: int, seconds: Iterable[float]) -> float:
    return round(nbytes / 1e9 / statistics.median(seconds), 2)


def bench(base: Path, mib: int, rounds: int) -> dict[str, object]:
    total = mib << 20
    device = torch.device("cuda")
    block = os.urandom(run.PAGE_BYTES)
    dest = torch.empty(total, dtype=torch.uint8, device=device)
    stager = PinnedStager(run.PAGE_BYTES, device)
    copies: dict[str, Callable[[Buffer, torch.Tensor], None]] = {"pinned": stager.copy, "plain": plain_copy}

    def from_memory(copy: Callable[[Buffer, torch.Tensor], None]) -> float:
        view = memoryview(bytearray(block))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for offset in range(0, total, run.PAGE_BYTES):
            copy(view, dest[offset : offset + run.PAGE_BYTES])
        stager.finish()
        return time.perf_counter() - start

    def from_disk(store: SparkCacheStore, copy: Callable[[Buffer, torch.Tensor], None]) -> float:
        for segment in work.rglob("*.seg"):
            run.drop_cached(segment)
        torch.cuda.synchronize()
        start = time.perf_counter()
        offset = 0
        for keys in snapshots:
            n = len(keys) * run.PAGE_BYTES
            assert restore_to_gpu(store, keys, dest[offset : offset + n], copy) == len(keys)
            offset += n
        stager.finish()
        return time.perf_counter() - start

    memory: dict[str, list[float]] = {"pinned": [], "plain": []}
    disk: dict[str, list[float]] = {"pinned": [], "plain": []}
    work = Path(tempfile.mkdtemp(prefix="sparkcache-gpu-", dir=base))
    try:
        snapshots = run.publish_snapshots(work, total, block, conversation=True)
        store = SparkCacheStore(work, run.IDENTITY, StoreLimits(reserve_bytes=0), writer=False)
        for copy in copies.values():
            from_memory(copy)  # warm-up: CUDA context, the driver's staging buffers
        for i in range(rounds):
            for name in ("pinned", "plain") if i % 2 == 0 else ("plain", "pinned"):
                memory[name].append(from_memory(copies[name]))
                disk[name].append(from_disk(store, copies[name]))
        expected = torch.frombuffer(bytearray(block), dtype=torch.uint8).to(device)
        landed = bool(
            torch.equal(dest.view(-1, run.PAGE_BYTES), expected.expand(total // run.PAGE_BYTES, -1))
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "sparkcache_device",
        "host": {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "filesystem_dir": str(base),
        "bytes_per_round": total,
        "rounds": rounds,
        "page_bytes": run.PAGE_BYTES,
        "read_workers": READ_WORKERS,
        "bytes_on_gpu_match": landed,
        "h2d_from_memory_GBps": {k: gbps(total, v) for k, v in memory.items()},
        "restore_cold_to_gpu_GBps": {k: gbps(total, v) for k, v in disk.items()},
        "sha256_one_core_MBps": round(run.sha256_MBps(1), 1),
        f"sha256_{READ_WORKERS}_threads_MBps": round(run.sha256_MBps(READ_WORKERS), 1),
        "per_round_s": {"memory": memory, "disk": disk},
        "method": __doc__.split("\n\n")[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    reason = gpu_missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return
    started = RunProvenance.capture()
    result = bench(args.dir, args.mib, args.rounds) | {"provenance": started.finish()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    append_run(history_path(args.out), result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
