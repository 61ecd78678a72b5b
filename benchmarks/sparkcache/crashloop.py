"""kill -9 during publication, over and over: only whole, verified snapshots may survive.

A child process publishes snapshots (shared prefixes, eviction under a small max_bytes) as
fast as it can; the parent kills it with SIGKILL at a random instant, reopens the store as
the next writer would (discovery plus leftover removal) and reads back every page of every
snapshot it finds. Any snapshot with a missing or unverifiable page is a failure.

    python -m benchmarks.sparkcache.crashloop --iterations 100 --root /var/tmp/sc-crash
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sparkcache.chunks import chunk_keys
from sparkcache.identity import CacheIdentity
from sparkcache.pages import LayerLayout, Page, PageError
from sparkcache.store import SparkCacheStore, StoreBusy, StoreLimits

IDENTITY = CacheIdentity("crashloop", "none", "float32", "test", 128, 1, 0, 1, 0, 1)
LIMITS = StoreLimits(max_bytes=24 << 20, low_watermark=0.6, reserve_bytes=0)


def make_page(identity_digest: str, key: str, nbytes: int, seed: int) -> Page:
    payload = random.Random(seed).randbytes(nbytes)
    return Page(key, identity_digest, (LayerLayout("layer0", "uint8", (nbytes,), nbytes),), payload)


def child(root: Path, seed: int) -> None:
    """Publish forever (until killed)."""
    rng = random.Random(seed)
    store = SparkCacheStore(root, IDENTITY, LIMITS, writer=True)
    while True:
        base = rng.randrange(8)  # few prefixes: snapshots share pages
        tokens = [base] * 256 + [rng.randrange(1 << 20) for _ in range(256 * rng.randrange(1, 6))]
        keys = chunk_keys(tokens)
        pages = {
            k: make_page(store.digest, k, rng.randrange(64 << 10, 1 << 20), int(k[:8], 16))
            for k in store.missing(keys)
        }
        store.publish(keys, len(keys) * 256, pages)


def verify(root: Path) -> tuple[int, int, list[str]]:
    """Reopen as the next writer would and read back every page of every snapshot found.

    Returns (snapshots, pages verified, failures); a failure is a snapshot that discovery
    admitted but whose pages do not all verify, or temporaries discovery left behind.
    """
    deadline = time.monotonic() + 10
    while True:  # the killed child's flock is released when the kernel reaps it
        try:
            store = SparkCacheStore(root, IDENTITY, LIMITS, writer=True)
            break
        except StoreBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    failures, pages = [], 0
    try:
        for snap in store.snapshots():
            for key in snap.pages:
                try:
                    store.read_page(key)
                    pages += 1
                except PageError as exc:
                    failures.append(f"snapshot {snap.key[:16]}: {exc}")
        failures += [f"temporary left: {p.name}" for p in (store.dir / "tmp").iterdir()]
        return len(store.snapshots()), pages, failures
    finally:
        store.close()


def run(root: Path, iterations: int, seed: int = 1) -> dict[str, object]:
    rng = random.Random(seed)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    snapshots_seen = pages_verified = mid_write = 0
    failures: list[str] = []
    tmp_dir = root / IDENTITY.dirname() / "tmp"
    for i in range(iterations):
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(root), str(seed * 1000 + i)])
        time.sleep(rng.uniform(0.3, 1.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        mid_write += any(tmp_dir.iterdir()) if tmp_dir.is_dir() else 0
        snaps, pages, bad = verify(root)
        snapshots_seen += snaps
        pages_verified += pages
        failures += [f"kill {i}: {b}" for b in bad]
    shutil.rmtree(root, ignore_errors=True)
    return {
        "kills": iterations,
        "kills_mid_write": mid_write,
        "failures": len(failures),
        "failure_details": failures[:20],
        "snapshots_verified_after_kills": snapshots_seen,
        "pages_verified_after_kills": pages_verified,
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--root", type=Path, default=Path("/var/tmp/sparkcache-crashloop"))
    args = parser.parse_args()
    print(json.dumps(run(args.root, args.iterations), indent=2))


if __name__ == "__main__":
    main()
