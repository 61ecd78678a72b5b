"""The page store on a real filesystem: publication, discovery, verification, limits, faults."""

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sparkcache import store as store_module
from sparkcache.chunks import chunk_keys
from sparkcache.identity import CacheIdentity
from sparkcache.pages import LayerLayout, Page, PageBuffers, PageError
from sparkcache.prefetch import Prefetcher, extents_of
from sparkcache.store import IdentityMismatch, SparkCacheStore, StoreBusy, StoreLimits

REPO = Path(__file__).resolve().parents[3]
IDENTITY = CacheIdentity("model@1", "none", "float32", "FullAttentionSpec:test", 128, 1, 0, 1, 0, 1)


def page(store: SparkCacheStore, key: str, nbytes: int = 4096, fill: int = 7) -> Page:
    return Page(key, store.digest, (LayerLayout("l0", "uint8", (nbytes,), nbytes),), bytes([fill]) * nbytes)


def publish_prompt(store: SparkCacheStore, tokens: list[int], nbytes: int = 4096) -> list[str]:
    keys = chunk_keys(tokens)
    result = store.publish(keys, len(keys) * 256, {k: page(store, k, nbytes) for k in store.missing(keys)})
    assert result.status == "published", result.reason
    return keys


def prompt(seed: int, chunks: int) -> list[int]:
    return [seed] * 256 + list(range(256 * (chunks - 1)))


@pytest.fixture
def store(tmp_path: Path):
    s = SparkCacheStore(tmp_path, IDENTITY, writer=True)
    yield s
    s.close()


def reopen(store: SparkCacheStore, limits: StoreLimits | None = None) -> SparkCacheStore:
    store.close()
    return SparkCacheStore(store.dir.parent, IDENTITY, limits, writer=True)


def test_publish_then_discover_in_a_new_process_view(store: SparkCacheStore) -> None:
    keys = publish_prompt(store, prompt(1, 3))
    fresh = reopen(store)
    assert fresh.match(keys) == 3
    assert fresh.match([*keys[:2], "f" * 64]) == 2
    assert [bytes(fresh.read_page(k).payload[:1]) for k in keys] == [b"\x07"] * 3
    fresh.close()


def segment_files(store: SparkCacheStore) -> list[Path]:
    return sorted((store.dir / "segments").glob("*.seg"))


def flip_byte(store: SparkCacheStore, key: str, at: int, mask: int) -> Path:
    """Flip bits of one page's byte in place (at < 0 counts from the page's end); its segment."""
    path, offset, nbytes = store.page_location(key)
    with path.open("r+b") as f:
        f.seek(offset + at % nbytes)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ mask]))
    return path


def test_shared_prefix_pages_are_stored_once(store: SparkCacheStore) -> None:
    short = publish_prompt(store, prompt(1, 2))
    long = publish_prompt(store, prompt(1, 4))
    assert long[:2] == short
    # One segment per publication; the longer prompt wrote only its two new pages.
    first, second = (store.page_location(k)[0] for k in (short[0], long[2]))
    assert segment_files(store) == sorted([first, second])
    assert [store.page_location(k)[0] for k in long] == [first, first, second, second]
    page_bytes = store.page_location(long[0])[2]
    assert first.stat().st_size == second.stat().st_size == 2 * page_bytes
    assert store.publish(long, 1024, {}).status == "exists"


def age(store: SparkCacheStore, snap_key: str) -> None:
    """Make a snapshot look unused for an hour (the LRU clock is the manifest mtime)."""
    old = time.time() - 3600
    os.utime(store.dir / "snapshots" / f"{snap_key}.json", (old, old))


def test_segment_lives_while_any_snapshot_lists_one_of_its_pages(tmp_path: Path) -> None:
    limits = StoreLimits(ttl_seconds=60, reserve_bytes=0)
    store = SparkCacheStore(tmp_path, IDENTITY, limits, writer=True)
    short = publish_prompt(store, prompt(5, 2))
    long = publish_prompt(store, prompt(5, 3))
    first = store.page_location(short[0])[0]
    age(store, short[-1])
    store = reopen(store, limits)
    assert store.evict() == [short[-1]]
    assert first.exists() and store.match(long) == 3  # its pages are still the long prompt's
    fresh = reopen(store, limits)
    assert [bytes(p.payload[:1]) for p in fresh.read_pages(long)] == [b"\x07"] * 3
    age(fresh, long[-1])
    fresh = reopen(fresh, limits)
    assert fresh.evict() == [long[-1]]
    assert segment_files(fresh) == [] and fresh.total_bytes() == 0
    fresh.close()


def test_manifest_pointing_past_its_segment_is_dropped(store: SparkCacheStore) -> None:
    keys = publish_prompt(store, prompt(6, 2))
    path, offset, nbytes = store.page_location(keys[1])
    os.truncate(path, offset + nbytes - 1)  # a segment cut short (not by SparkCache)
    fresh = reopen(store)
    assert fresh.match(keys) == 0 and fresh.snapshots() == []
    assert segment_files(fresh) == []  # listed by no manifest now: removed
    fresh.close()


def test_discovery_reads_metadata_only_and_restore_verifies(store: SparkCacheStore) -> None:
    keys = publish_prompt(store, prompt(2, 2))
    victim = flip_byte(store, keys[1], -10, 0x01)  # one flipped bit in the KV payload
    fresh = reopen(store)
    assert fresh.match(keys) == 2  # discovery does not read page bytes
    fresh.read_page(keys[0])
    with pytest.raises(PageError, match="sha256"):
        fresh.read_page(keys[1])
    # The bad page and every snapshot listing it are gone: never matched, never served again.
    assert fresh.match(keys) == 0
    assert not victim.exists()
    assert fresh.snapshots() == []
    fresh.close()


def publish_distinct(store: SparkCacheStore, seed: int, chunks: int, nbytes: int = 4096) -> list[str]:
    """A snapshot whose page i is filled with byte i: a page served out of order shows."""
    keys = chunk_keys(prompt(seed, chunks))
    pages = {k: page(store, k, nbytes, fill=i) for i, k in enumerate(keys)}
    assert store.publish(keys, chunks * 256, pages).status == "published"
    return keys


@pytest.mark.parametrize(("ahead_pages", "prefetch_pages"), [(1, 0), (3, 2), (100, 100)])
def test_read_pages_yields_every_page_in_order(
    store: SparkCacheStore, monkeypatch: pytest.MonkeyPatch, ahead_pages: int, prefetch_pages: int
) -> None:
    monkeypatch.setattr(store_module, "READ_AHEAD_BYTES", ahead_pages * 4200)
    monkeypatch.setattr(store_module, "PREFETCH_AHEAD_BYTES", prefetch_pages * 4200)
    keys = publish_distinct(store, 50, 9)
    fresh = reopen(store)
    got = list(fresh.read_pages(keys))
    assert [p.key for p in got] == keys
    assert [bytes(p.payload) for p in got] == [bytes([i]) * 4096 for i in range(9)]
    fresh.close()


def test_read_pages_across_segments_and_an_unpublished_page(store: SparkCacheStore) -> None:
    short = publish_distinct(store, 53, 3)
    long = chunk_keys(prompt(53, 6))
    assert (
        store.publish(long, 6 * 256, {k: page(store, k, fill=i) for i, k in enumerate(long)}).status
        == "published"
    )
    fresh = reopen(store)
    got = list(fresh.read_pages([*long[:5], "f" * 64, long[5]]))
    assert [bytes(p.payload[:1]) for p in got[:5]] == [bytes([i]) for i in range(5)]
    assert isinstance(got[5], PageError) and "not published" in str(got[5])
    assert bytes(got[6].payload[:1]) == b"\x05" and short == long[:3]
    fresh.close()


def test_read_pages_never_serves_a_flipped_byte(store: SparkCacheStore) -> None:
    keys = publish_distinct(store, 51, 6)
    victim = flip_byte(store, keys[3], 100, 0x80)
    fresh = reopen(store)
    got = list(fresh.read_pages(keys))
    assert [bytes(p.payload[:1]) for p in got[:3]] == [b"\x00", b"\x01", b"\x02"]
    assert isinstance(got[3], PageError) and "sha256" in str(got[3])
    # A page after it is either refused (its snapshot is gone) or verified before the removal.
    for i, p in enumerate(got[4:], start=4):
        assert isinstance(p, PageError) or bytes(p.payload) == bytes([i]) * 4096
    assert fresh.match(keys) == 0 and not victim.exists()
    fresh.close()


def test_read_pages_closed_early_leaves_no_reader_thread(store: SparkCacheStore) -> None:
    keys = publish_distinct(store, 52, 12)
    fresh = reopen(store)
    pages = fresh.read_pages(keys)
    first = next(pages)
    pages.close()  # the connector stops at the first bad page
    assert bytes(first.payload[:1]) == b"\x00"
    assert not [
        t for t in threading.enumerate() if t.name.startswith(("sparkcache-read", "sparkcache-prefetch"))
    ]
    fresh.close()


def test_reader_sees_publications_and_evictions(store: SparkCacheStore, tmp_path: Path) -> None:
    reader = SparkCacheStore(tmp_path, IDENTITY, writer=False)
    keys = publish_prompt(store, prompt(3, 2))
    reader.refresh()
    assert reader.match(keys) == 2
    store.quarantine(keys[0])
    reader.refresh()
    assert reader.match(keys) == 0


def test_other_geometry_is_never_read(store: SparkCacheStore, tmp_path: Path) -> None:
    keys = publish_prompt(store, prompt(4, 2))
    for field, value in [
        ("kv_dtype", "bfloat16"),
        ("tp_size", 2),
        ("interleave", 2),
        ("model_revision", "m@2"),
    ]:
        other = CacheIdentity(**{**IDENTITY.record(), field: value})
        assert other.dirname() != IDENTITY.dirname()
        assert SparkCacheStore(tmp_path, other, writer=False).match(keys) == 0
    # A directory whose recorded identity differs from its name is refused outright.
    store.close()
    (store.dir / "identity.json").write_text(json.dumps({**IDENTITY.record(), "kv_dtype": "fp8"}))
    with pytest.raises(IdentityMismatch, match="refusing"):
        SparkCacheStore(tmp_path, IDENTITY, writer=False)
    for _ in range(2):  # a refused writer releases the directory (else: StoreBusy the second time)
        with pytest.raises(IdentityMismatch):
            SparkCacheStore(tmp_path, IDENTITY, writer=True)


def test_one_writer_per_directory(store: SparkCacheStore, tmp_path: Path) -> None:
    with pytest.raises(StoreBusy):
        SparkCacheStore(tmp_path, IDENTITY, writer=True)


def test_limits_evict_least_recently_used_to_the_low_watermark(tmp_path: Path) -> None:
    limits = StoreLimits(max_bytes=40_000, low_watermark=0.8, reserve_bytes=0)
    store = SparkCacheStore(tmp_path, IDENTITY, limits, writer=True)
    a = publish_prompt(store, prompt(10, 2))  # ~8.6 kB each
    time.sleep(0.01)
    b = publish_prompt(store, prompt(11, 2))
    time.sleep(0.01)
    c = publish_prompt(store, prompt(12, 2))
    time.sleep(0.01)
    store.touch(a[-1])  # a is now the most recently used
    e = publish_prompt(store, prompt(14, 2))
    survivors = {s.key for s in store.snapshots()}
    assert survivors == {a[-1], c[-1], e[-1]}  # b, the least recently used, went first
    assert b[-1] not in survivors  # least recently used went first
    assert store.total_bytes() <= limits.max_bytes
    fresh = reopen(store, limits)  # the LRU order survives a restart (manifest mtimes)
    assert [s.key for s in fresh.snapshots()] == [c[-1], a[-1], e[-1]]
    fresh.close()


def test_ttl_expires_unused_snapshots(tmp_path: Path) -> None:
    store = SparkCacheStore(tmp_path, IDENTITY, StoreLimits(ttl_seconds=60, reserve_bytes=0), writer=True)
    old = publish_prompt(store, prompt(20, 1))
    manifest = store.dir / "snapshots" / f"{old[-1]}.json"
    os.utime(manifest, (time.time() - 3600, time.time() - 3600))
    store = reopen(store, StoreLimits(ttl_seconds=60, reserve_bytes=0))
    new = publish_prompt(store, prompt(21, 1))
    assert {s.key for s in store.snapshots()} == {new[-1]}
    assert store.match(old) == 0
    store.close()


def test_crash_leftovers_are_removed_on_open(store: SparkCacheStore) -> None:
    keys = publish_prompt(store, prompt(30, 2))
    orphan = store.dir / "segments" / "ab-1.seg"  # linked, then killed before its manifest
    orphan.write_bytes(b"half a page")
    (store.dir / "tmp" / "x.123").write_bytes(b"unpublished")
    fresh = reopen(store)
    assert not orphan.exists() and not any((fresh.dir / "tmp").iterdir())
    assert fresh.match(keys) == 2
    fresh.close()


def test_kill_9_during_publication_leaves_only_verified_snapshots(tmp_path: Path) -> None:
    """The benchmark's crash loop, 8 kills here (the benchmark runs >= 100)."""
    from benchmarks.sparkcache import crashloop

    result = crashloop.run(tmp_path / "crash", iterations=8)
    assert result["failures"] == 0, result["failure_details"]
    assert result["pages_verified_after_kills"] > 0


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A 256 KiB tmpfs this test mounts and removes: a disk that really fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "sparkcache-test", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)


def test_disk_full_skips_publication_and_keeps_serving(
    tiny_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SparkCacheStore(tiny_tmpfs, IDENTITY, StoreLimits(reserve_bytes=0), writer=True)
    try:
        small = publish_prompt(store, prompt(40, 1), nbytes=1000)
        real = shutil.disk_usage(tiny_tmpfs)
        # More pages than the disk holds, while the free-space check is told there is room
        # (as when another writer fills the disk right after it): the write hits ENOSPC.
        n = real.free // 4200 + 2
        keys = chunk_keys(prompt(41, n))
        with monkeypatch.context() as patch:
            patch.setattr(shutil, "disk_usage", lambda _: real._replace(free=1 << 40))
            result = store.publish(keys, n * 256, {k: page(store, k, 4200) for k in keys})
        assert result.status == "skipped" and "disk full" in result.reason
        # Too big for the free space outright: refused before writing anything.
        huge = chunk_keys(prompt(42, 1))
        assert "disk full" in store.publish(huge, 256, {huge[0]: page(store, huge[0], 1 << 20)}).reason
        assert segment_files(store) == [store.page_location(small[0])[0]]
        assert not any((store.dir / "tmp").iterdir())
        assert store.match(keys) == 0 and store.match(small) == 1
        assert bytes(store.read_page(small[0]).payload) == bytes([7]) * 1000  # serving goes on
    finally:
        store.close()


def test_page_buffers_are_reused_only_when_no_view_of_them_lives() -> None:
    buffers = PageBuffers(keep_bytes=1 << 20)
    first = buffers.take(100)
    view = memoryview(first)[10:]  # what a yielded page's payload is
    first_id = id(first)
    del first
    second = buffers.take(100)
    assert id(second) != first_id  # the first is still seen through `view`: never handed out
    second_id = id(second)
    del second
    assert id(buffers.take(100)) == second_id  # nothing holds the second any more: reused
    del view
    assert id(buffers.take(100)) == first_id  # nor the first, now
    assert len(buffers.take(200)) == 200  # another size: a buffer of that size


def test_extents_merge_neighbouring_pages_of_one_file() -> None:
    a, b = Path("a.seg"), Path("b.seg")
    records = [(a, 0, 10), (a, 10, 5), None, (a, 20, 5), (b, 0, 3), (b, 3, 3)]
    assert extents_of(records) == [(a, 0, 15), (a, 20, 5), (b, 0, 6)]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sparkcache-prefetch"]


def test_prefetcher_waits_for_the_consumer_and_stops_when_closed(tmp_path: Path) -> None:
    big = tmp_path / "big.seg"
    big.write_bytes(bytes(8 << 20))
    started = time.monotonic()
    with Prefetcher([(big, 0, 8 << 20)], ahead=0):
        time.sleep(0.2)  # the consumer takes nothing: the prefetcher waits for room
        assert prefetch_threads()
    assert time.monotonic() - started < 10 and not prefetch_threads()


def test_prefetcher_stops_quietly_at_a_missing_segment(tmp_path: Path) -> None:
    with Prefetcher([(tmp_path / "gone.seg", 0, 100)], ahead=1 << 20):
        deadline = time.monotonic() + 10
        while prefetch_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not prefetch_threads()  # ended on its own; the readers report the missing file


def test_an_unwritable_store_skips_publication_naming_the_cause(store: SparkCacheStore) -> None:
    """The store made immutable under the running writer (`chattr +i`, which stops root too): the
    publication is skipped with the errno's name as its cause (what /metrics counts as
    sparkring:sparkcache_publication_failures_total{reason="eperm"}), and serving goes on."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("chattr +i needs root and e2fsprogs' chattr")
    kept = publish_prompt(store, prompt(50, 1))
    frozen = store.dir / "tmp"
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"this filesystem has no immutable flag ({frozen})")
    try:
        keys = chunk_keys(prompt(51, 2))
        result = store.publish(keys, 512, {k: page(store, k) for k in keys})
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
    assert (result.status, result.cause) == ("skipped", "eperm"), result
    assert "Operation not permitted" in result.reason
    assert store.match(keys) == 0 and store.match(kept) == 1


def test_every_skip_has_a_cause_and_a_publication_has_none(tmp_path: Path) -> None:
    store = SparkCacheStore(tmp_path, IDENTITY, StoreLimits(max_bytes=8192), writer=True)
    try:
        keys = chunk_keys(prompt(60, 1))
        assert store.publish(keys, 256, {k: page(store, k, 1000) for k in keys}).cause == ""
        big = chunk_keys(prompt(61, 1))
        assert store.publish(big, 256, {big[0]: page(store, big[0], 1 << 16)}).cause == "too_large"
        two = chunk_keys(prompt(62, 2))
        assert store.publish(two, 512, {}).cause == "pages_missing"
    finally:
        store.close()
    assert store_module.publication_cause(OSError(28, "No space left on device")) == "disk_full"
    assert store_module.publication_cause(OSError(30, "Read-only file system")) == "erofs"
    assert store_module.publication_cause(KeyError("k")) == "keyerror"
