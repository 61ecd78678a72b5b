"""The page store on a rank's local disk: publication, discovery, verified restore, eviction.

    <root>/id-<identity digest>/identity.json        the full identity, checked on every open
                               segments/<name>.seg    the pages one publication added, back to back
                               snapshots/<key>.json   a manifest: the pages of one prompt prefix,
                                                      each as (key, sha256, size, segment, offset)
                               tmp/                   files not yet published
                               owner.lock             one writer per identity directory

A publication writes the pages the store lacks into one new segment (write, fsync, link,
directory fsync), then its manifest the same way, last: a snapshot becomes visible only when
its manifest appears, so a crash at any instant leaves whole, verified snapshots plus
orphans that the next writer removes. One file per publication rather than per page: one
file to create, sync and link, not one per page (publishing 256 KiB pages ran about twice as
fast here), and a restore reads long runs of one file, where every new file costs the disk a
cold start. A segment is deleted once no manifest lists any of its pages.

The index is rebuilt from manifests alone (page bytes are read only to restore them). Every
restored page is checked against its manifest's sha256; a bad page is removed with every
snapshot that lists it. Restore reads and hashes a few pages at once: one core's sha256 is
slower than the disk.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from sparkcache.durable import fsync_dir, publish_file, unlink_quietly, write_synced
from sparkcache.identity import CacheIdentity
from sparkcache.pages import Page, PageBuffers, PageError, encode_page, page_sha256, read_page_at
from sparkcache.prefetch import Prefetcher, extents_of

log = logging.getLogger(__name__)

READ_WORKERS = min(4, os.cpu_count() or 1)
"""Pages read and verified at once: sha256 runs ~1.7 GB/s on one core, an NVMe several times that."""
READ_AHEAD_BYTES = 256 << 20
"""Bytes of pages read ahead of the consumer at most (each is held until it is yielded)."""
PAGE_BUFFER_BYTES = 64 << 20
"""Read buffers a store keeps for reuse (see pages.PageBuffers)."""
PREFETCH_AHEAD_BYTES = 32 << 20
"""Bytes the prefetcher pulls into the page cache ahead of the consumer (see prefetch.py)."""
SEGMENT_SUFFIX = ".seg"


class IdentityMismatch(Exception):
    """The directory holds a cache of another geometry: it must not be read."""


class StoreBusy(Exception):
    """Another process already writes this identity directory."""


@dataclass(frozen=True)
class StoreLimits:
    """max_bytes None: unbounded. Eviction, oldest use first, goes down to low_watermark x max."""

    max_bytes: int | None = None
    low_watermark: float = 0.8
    ttl_seconds: float | None = None
    reserve_bytes: int = 64 << 20  # free space left on the filesystem for everyone else

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes {self.max_bytes} must be positive (or null for unbounded)")
        if not 0 < self.low_watermark <= 1:
            raise ValueError(f"low_watermark {self.low_watermark} must be in (0, 1]")
        if self.ttl_seconds is not None and self.ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds {self.ttl_seconds} must be positive (or null for no TTL)")


@dataclass(frozen=True)
class PageRecord:
    """Where a page lies and what its bytes must hash to (one manifest entry)."""

    sha256: str
    nbytes: int
    segment: str
    offset: int

    def entry(self, key: str) -> list[object]:
        return [key, self.sha256, self.nbytes, self.segment, self.offset]


@dataclass
class Snapshot:
    key: str
    pages: list[str]
    tokens: int
    last_used: float
    manifest_bytes: int


@dataclass
class PublishResult:
    status: str  # "published" | "exists" | "skipped"
    reason: str = ""
    # Why a skip happened, as a short fixed word for /metrics (publication_cause): "" unless skipped.
    cause: str = ""
    bytes_written: int = 0
    evicted: list[str] = field(default_factory=list)


def publication_cause(exc: BaseException) -> str:
    """A failed publication's cause as one short word for /metrics: disk_full, or the errno's
    name (eperm, eacces, erofs, eio, ...), or the exception's type for anything else."""
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "disk_full"
    if code in errno.errorcode:
        return errno.errorcode[code].lower()
    return type(exc).__name__.lower()


def manifest_checksum(body: dict[str, object]) -> str:
    """sha256 of a manifest's canonical JSON without its own checksum field."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class SegmentFiles:
    """Segments opened once for one restore and shared by its reader threads (pread needs no
    file position); all closed together."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, segment: str) -> int:
        with self._lock:
            if segment not in self._fds:
                self._fds[segment] = os.open(self._dir / segment, os.O_RDONLY)
            return self._fds[segment]

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


class SparkCacheStore:
    """One identity's pages. `writer=True` owns the directory (publishes, evicts, cleans);
    readers (the scheduler) only look up what is published."""

    def __init__(
        self, root: Path, identity: CacheIdentity, limits: StoreLimits | None = None, *, writer: bool
    ) -> None:
        self.identity = identity
        self.digest = identity.digest()
        self.limits = limits or StoreLimits()
        self.writer = writer
        self.dir = Path(root) / identity.dirname()
        self._lock = threading.RLock()
        self._pages: dict[str, PageRecord] = {}
        self._refs: dict[str, set[str]] = {}  # page key -> snapshots listing it
        self._segments: dict[str, int] = {}  # segment -> bytes, while a listed page lies in it
        self._snapshots: dict[str, Snapshot] = {}
        self._seen_mtime = -1
        self._last_stamp_ns = 0
        self._owner_fd: int | None = None
        self._buffers = PageBuffers(PAGE_BUFFER_BYTES)
        if writer:
            self._open_writer()
        try:
            self._check_identity()
            self.discover()
        except BaseException:
            self.close()  # a refused directory must not stay locked
            raise

    # -- opening -------------------------------------------------------------------------
    def _open_writer(self) -> None:
        for sub in ("segments", "snapshots", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StoreBusy(f"{self.dir} is already written by another process") from exc
        self._owner_fd = fd
        ident = self.dir / "identity.json"
        if not ident.exists():
            tmp = self.dir / "tmp" / f"identity.{os.getpid()}"
            unlink_quietly(tmp)
            write_synced(tmp, self.identity.canonical())
            publish_file(tmp, ident)
            fsync_dir(self.dir.parent)

    def _check_identity(self) -> None:
        ident = self.dir / "identity.json"
        if not ident.exists():
            return  # a reader before the first publication: nothing to read yet
        stored = ident.read_bytes()
        if stored != self.identity.canonical():
            raise IdentityMismatch(
                f"{ident} records another cache identity ({stored[:120]!r}...) than this process "
                f"({self.digest[:16]}): refusing to read it; move it away or fix the geometry"
            )

    def close(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # releases the flock
            self._owner_fd = None

    # -- discovery -----------------------------------------------------------------------
    def _snapshot_dir(self) -> Path:
        return self.dir / "snapshots"

    def _segment_dir(self) -> Path:
        return self.dir / "segments"

    def _read_manifest(self, path: Path) -> tuple[Snapshot, dict[str, PageRecord]] | None:
        """Parse one manifest; None when it is unreadable or not ours (it is then ignored)."""
        try:
            raw = path.read_bytes()
            body = json.loads(raw)
            checksum = body.pop("checksum")
            if checksum != manifest_checksum(body) or body["identity"] != self.digest:
                return None
            records = {k: PageRecord(s, int(n), str(seg), int(off)) for k, s, n, seg, off in body["pages"]}
            pages = [entry[0] for entry in body["pages"]]
            if pages[-1] != body["snapshot"] or path.stem != body["snapshot"] or len(records) != len(pages):
                return None
            stat = path.stat()
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None
        with self._lock:
            self._last_stamp_ns = max(self._last_stamp_ns, stat.st_mtime_ns)
        snap = Snapshot(body["snapshot"], pages, int(body["tokens"]), stat.st_mtime_ns / 1e9, len(raw))
        return snap, records

    def _usable(self, records: dict[str, PageRecord], segments: dict[str, int]) -> bool:
        """Every page lies inside a segment on disk, where any other manifest also puts it."""
        for key, rec in records.items():
            if rec.offset < 0 or rec.offset + rec.nbytes > segments.get(rec.segment, -1):
                return False
            if self._pages.get(key, rec) != rec:
                return False
        return True

    def _listed_segments(self) -> dict[str, int]:
        sizes = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._segment_dir()):
                if entry.name.endswith(SEGMENT_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        sizes[entry.name] = entry.stat().st_size
        return sizes

    def discover(self) -> None:
        """(Re)build the index from the manifests; a writer also removes crash leftovers."""
        with self._lock:
            self._pages.clear()
            self._refs.clear()
            self._snapshots.clear()
            self._segments.clear()
            snap_dir = self._snapshot_dir()
            if not snap_dir.is_dir():
                return
            self._seen_mtime = snap_dir.stat().st_mtime_ns
            present = self._listed_segments()
            for path in sorted(snap_dir.glob("*.json")):
                parsed = self._read_manifest(path)
                # A reader may see a manifest whose segment the writer just removed: it skips it.
                if parsed is None or not self._usable(parsed[1], present):
                    if self.writer:
                        log.warning("SparkCache: dropping unusable manifest %s", path.name)
                        unlink_quietly(path)
                    continue
                snap, records = parsed
                self._pages.update(records)
                self._add(snap)
                for rec in records.values():
                    self._segments[rec.segment] = present[rec.segment]
            if self.writer:
                self._remove_leftovers(present)

    def _remove_leftovers(self, present: dict[str, int]) -> None:
        """Segments no manifest lists and unpublished temporaries: what a crash leaves behind."""
        for segment in present.keys() - self._segments.keys():
            unlink_quietly(self._segment_dir() / segment)
        for tmp in (self.dir / "tmp").iterdir():
            unlink_quietly(tmp)

    def refresh(self) -> None:
        """Pick up what the writer published or evicted since the last look (readers)."""
        snap_dir = self._snapshot_dir()
        try:
            mtime = snap_dir.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._seen_mtime:
            self._check_identity()
            self.discover()

    def _add(self, snap: Snapshot) -> None:
        self._snapshots[snap.key] = snap
        for key in snap.pages:
            self._refs.setdefault(key, set()).add(snap.key)

    # -- lookup and restore --------------------------------------------------------------
    def match(self, keys: list[str]) -> int:
        """How many leading chunks of `keys` published snapshots hold (no page is read)."""
        with self._lock:
            n = 0
            while n < len(keys) and keys[n] in self._refs:
                n += 1
            return n

    def page_location(self, key: str) -> tuple[Path, int, int]:
        """(segment file, offset, size) of a published page: for tools and fault tests."""
        with self._lock:
            record = self._pages[key]
        return self._segment_dir() / record.segment, record.offset, record.nbytes

    def missing(self, keys: list[str]) -> list[str]:
        with self._lock:
            return [k for k in keys if k not in self._refs]

    def read_page(self, key: str) -> Page:
        """The verified page for `key`; PageError (and removal, for a writer) otherwise."""
        segments = SegmentFiles(self._segment_dir())
        try:
            return self._read_verified(key, segments)
        finally:
            segments.close()

    def _read_verified(self, key: str, segments: SegmentFiles) -> Page:
        with self._lock:
            record = self._pages.get(key)
        if record is None:
            raise PageError(f"page {key[:16]} is not published")
        try:
            fd = segments.fd(record.segment)
            return read_page_at(
                fd,
                record.offset,
                record.nbytes,
                key=key,
                identity=self.digest,
                sha256=record.sha256,
                buffers=self._buffers,
            )
        except Exception as exc:  # unreadable or wrong: never served, and a writer removes it
            if self.writer:
                self.quarantine(key)
            if isinstance(exc, PageError):
                raise
            raise PageError(f"page {key[:16]}: {exc}") from exc

    def read_pages(self, keys: list[str]) -> Iterator[Page | PageError]:
        """Verified pages in order (a failure is yielded, not raised).

        Up to READ_WORKERS threads each read and hash a page (pread and hashlib release the
        GIL), within READ_AHEAD_BYTES of pages not yet yielded, while a prefetcher keeps the
        segments streaming into the page cache ahead of them. A page is yielded only after
        its own sha256 matched. Closing the generator early cancels what has not started and
        waits for what has.
        """
        with self._lock:
            records = [self._pages.get(k) for k in keys]
        sizes = [r.nbytes if r is not None else 0 for r in records]
        extents = extents_of(
            [
                (self._segment_dir() / r.segment, r.offset, r.nbytes) if r is not None else None
                for r in records
            ]
        )
        segments = SegmentFiles(self._segment_dir())
        pool = ThreadPoolExecutor(READ_WORKERS, thread_name_prefix="sparkcache-read")
        queued: deque[Future[Page]] = deque()
        ahead = 0  # bytes queued, being read, or read and not yet yielded
        try:
            with Prefetcher(extents, PREFETCH_AHEAD_BYTES) as prefetch:
                for i in range(len(keys)):
                    nxt = i + len(queued)
                    while nxt < len(keys) and (not queued or ahead + sizes[nxt] <= READ_AHEAD_BYTES):
                        queued.append(pool.submit(self._read_verified, keys[nxt], segments))
                        ahead += sizes[nxt]
                        nxt += 1
                    future = queued.popleft()
                    ahead -= sizes[i]
                    try:
                        page: Page | PageError = future.result()
                    except PageError as exc:
                        page = exc
                    prefetch.consumed(sizes[i])
                    yield page
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            segments.close()

    def _use_stamp(self) -> int:
        """A strictly increasing wall-clock stamp in ns for the LRU order.

        File mtimes set by the kernel's coarse clock can lag `time.time()`, so a manifest
        published just after a touch could sort before it; every use is stamped from here.
        """
        with self._lock:
            self._last_stamp_ns = max(time.time_ns(), self._last_stamp_ns + 1_000)
            return self._last_stamp_ns

    def _mark_used(self, snap_key: str, stamp_ns: int) -> None:
        self._snapshots[snap_key].last_used = stamp_ns / 1e9
        if self.writer:
            with contextlib.suppress(FileNotFoundError):
                os.utime(self._snapshot_dir() / f"{snap_key}.json", ns=(stamp_ns, stamp_ns))

    def touch(self, key: str) -> None:
        """Mark every snapshot holding `key` as just used (LRU order survives restarts)."""
        with self._lock:
            stamp = self._use_stamp()
            for snap_key in self._refs.get(key, ()):
                self._mark_used(snap_key, stamp)

    def quarantine(self, key: str) -> None:
        """Remove a bad page and every snapshot that lists it, so it is never matched again."""
        with self._lock:
            log.warning("SparkCache: page %s failed verification; removing it and its snapshots", key[:16])
            self._drop_snapshots(sorted(self._refs.get(key, ())))

    # -- accounting and eviction ---------------------------------------------------------
    def total_bytes(self) -> int:
        """Bytes on disk: whole segments (a page no snapshot lists still fills its segment)."""
        with self._lock:
            return sum(self._segments.values()) + sum(s.manifest_bytes for s in self._snapshots.values())

    def snapshots(self) -> list[Snapshot]:
        with self._lock:
            return sorted(self._snapshots.values(), key=lambda s: s.last_used)

    def _drop_snapshots(self, snap_keys: list[str]) -> None:
        """Manifests first (durably), then the segments none of whose pages is still listed."""
        freed: set[str] = set()
        for snap_key in snap_keys:
            snap = self._snapshots.pop(snap_key, None)
            if snap is None:
                continue
            unlink_quietly(self._snapshot_dir() / f"{snap_key}.json")
            for key in snap.pages:
                refs = self._refs.get(key)
                if refs is not None:
                    refs.discard(snap_key)
                    if not refs:
                        del self._refs[key]
                        freed.add(self._pages.pop(key).segment)
        if not snap_keys:
            return
        fsync_dir(self._snapshot_dir())
        empty = freed - {rec.segment for rec in self._pages.values()}
        for segment in empty:
            del self._segments[segment]
            unlink_quietly(self._segment_dir() / segment)
        if empty:
            fsync_dir(self._segment_dir())

    def evict(self, need_bytes: int = 0, keep: frozenset[str] = frozenset()) -> list[str]:
        """Apply the TTL, then make room for `need_bytes` under max_bytes, oldest use first.

        When over the limit, eviction goes down to the low watermark so it does not run on
        every publication. Snapshots whose pages are in `keep` (about to be reused) stay.
        """
        evicted: list[str] = []
        with self._lock:
            if self.limits.ttl_seconds is not None:
                horizon = time.time() - self.limits.ttl_seconds
                expired = [s.key for s in self.snapshots() if s.last_used < horizon]
                self._drop_snapshots(expired)
                evicted += expired
            max_bytes = self.limits.max_bytes
            if max_bytes is not None and self.total_bytes() + need_bytes > max_bytes:
                target = int(max_bytes * self.limits.low_watermark) - need_bytes
                for snap in self.snapshots():
                    if self.total_bytes() <= target:
                        break
                    if keep.isdisjoint(snap.pages):
                        self._drop_snapshots([snap.key])
                        evicted.append(snap.key)
        return evicted

    # -- publication ---------------------------------------------------------------------
    def publish(self, keys: list[str], tokens: int, pages: dict[str, Page]) -> PublishResult:
        """Publish the snapshot of the prefix `keys` (chain order); `pages` holds at least
        every page the store does not have. Never raises for disk trouble: a publication that
        cannot complete is skipped and leaves no visible trace."""
        if not self.writer:
            raise RuntimeError("publish needs the writer store")
        snap_key = keys[-1]
        manifest_path = self._snapshot_dir() / f"{snap_key}.json"
        with self._lock:
            if snap_key in self._snapshots:
                self.touch(snap_key)
                return PublishResult("exists")
            todo = [k for k in keys if k not in self._refs]
            absent = [k for k in todo if k not in pages]
            if absent:
                return PublishResult(
                    "skipped", f"{len(absent)} page(s) neither stored nor supplied", cause="pages_missing"
                )
        blobs = [encode_page(pages[k]) for k in todo]
        sizes = [len(head) + memoryview(payload).nbytes for head, payload in blobs]
        need = sum(sizes) + 4096
        if self.limits.max_bytes is not None and need > self.limits.max_bytes:
            return PublishResult("skipped", f"snapshot of {need} bytes exceeds max_bytes", cause="too_large")
        evicted = self.evict(need, keep=frozenset(keys))
        free = shutil.disk_usage(self.dir).free
        if free < need + self.limits.reserve_bytes:
            return PublishResult(
                "skipped", f"disk full: {free} bytes free, {need} needed", evicted=evicted, cause="disk_full"
            )
        segment = f"{snap_key[:32]}-{self._use_stamp():x}{SEGMENT_SUFFIX}"
        records: dict[str, PageRecord] = {}
        offset = 0
        for key, (head, payload), nbytes in zip(todo, blobs, sizes, strict=True):
            records[key] = PageRecord(page_sha256(head, payload), nbytes, segment, offset)
            offset += nbytes
        tmp_dir = self.dir / "tmp"
        linked = False
        try:
            if todo:
                tmp = tmp_dir / f"{segment}.{os.getpid()}"
                unlink_quietly(tmp)
                write_synced(tmp, *(part for blob in blobs for part in blob))
                publish_file(tmp, self._segment_dir() / segment, exist_ok=False)
                linked = True
            with self._lock:
                for key in keys:
                    if key not in records:
                        records[key] = self._pages[key]
            body: dict[str, object] = {
                "format_version": self.identity.format_version,
                "identity": self.digest,
                "snapshot": snap_key,
                "tokens": tokens,
                "created": time.time(),
                "pages": [records[k].entry(k) for k in keys],
            }
            body["checksum"] = manifest_checksum(body)
            raw = json.dumps(body, sort_keys=True).encode()
            tmp = tmp_dir / f"{snap_key}.json.{os.getpid()}"
            unlink_quietly(tmp)
            write_synced(tmp, raw)
            publish_file(tmp, manifest_path)  # the commit point
        except (OSError, KeyError) as exc:
            if linked:
                unlink_quietly(self._segment_dir() / segment)
            cause = publication_cause(exc)
            reason = "disk full" if cause == "disk_full" else "error"
            log.warning("SparkCache: publication of %s skipped (%s: %s)", snap_key[:16], reason, exc)
            return PublishResult("skipped", f"{reason}: {exc}", evicted=evicted, cause=cause)
        with self._lock:
            self._pages.update(records)
            if todo:
                self._segments[segment] = offset
            self._add(Snapshot(snap_key, list(keys), tokens, time.time(), len(raw)))
            self._mark_used(snap_key, self._use_stamp())
            self._seen_mtime = self._snapshot_dir().stat().st_mtime_ns
        return PublishResult("published", bytes_written=need, evicted=evicted)
