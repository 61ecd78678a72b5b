"""Device lane: SparkCache pages restored into GPU memory, through pinned staging and plainly.

    PYTHONPATH=. python3 -m pytest -q tests/device/sparkcache
    python3 -m benchmarks.sparkcache.gpu_restore --out OUT.json   # the figures

Needs torch with CUDA and a GPU; skips with the reason otherwise.
"""

from pathlib import Path

import pytest

from benchmarks.sparkcache import gpu_restore
from sparkcache.chunks import chunk_keys
from sparkcache.identity import CacheIdentity
from sparkcache.pages import LayerLayout, Page
from sparkcache.store import SparkCacheStore, StoreLimits

pytestmark = pytest.mark.device
IDENTITY = CacheIdentity("model@1", "none", "uint8", "FullAttentionSpec:gpu", 128, 1, 0, 1, 0, 1)
PAGE = 1 << 20
COPIES = ["pinned", "plain"]


@pytest.fixture
def cuda():
    reason = gpu_restore.gpu_missing_reason()
    if reason:
        pytest.skip(reason)
    return gpu_restore.torch


@pytest.fixture
def published(tmp_path: Path) -> tuple[SparkCacheStore, list[str]]:
    """Six 1 MiB pages, page i filled with byte i + 1 (0 is what an untouched GPU byte holds)."""
    store = SparkCacheStore(tmp_path, IDENTITY, StoreLimits(reserve_bytes=0), writer=True)
    keys = chunk_keys(list(range(256 * 6)))
    layout = (LayerLayout("kv", "uint8", (PAGE,), PAGE),)
    pages = {k: Page(k, store.digest, layout, bytes([i + 1]) * PAGE) for i, k in enumerate(keys)}
    assert store.publish(keys, len(keys) * 256, pages).status == "published"
    yield store, keys
    store.close()


def copier(cuda, name: str):
    if name == "plain":
        return gpu_restore.plain_copy, lambda: None
    stager = gpu_restore.PinnedStager(PAGE, cuda.device("cuda"))
    return stager.copy, stager.finish


def page_fills(cuda, dest) -> list[int]:
    """The distinct byte of each page-sized region of `dest` (-1 where a region is mixed)."""
    rows = dest.view(-1, PAGE).cpu()
    return [int(r[0]) if bool(cuda.all(r == r[0])) else -1 for r in rows]


@pytest.mark.parametrize("name", COPIES)
def test_restore_lands_every_verified_page_on_the_gpu(cuda, published, name: str) -> None:
    store, keys = published
    dest = cuda.zeros(len(keys) * PAGE, dtype=cuda.uint8, device="cuda")
    copy, finish = copier(cuda, name)
    assert gpu_restore.restore_to_gpu(store, keys, dest, copy) == len(keys)
    finish()
    assert page_fills(cuda, dest) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("name", COPIES)
def test_a_flipped_byte_never_reaches_the_gpu(cuda, published, name: str) -> None:
    store, keys = published
    victim, offset, nbytes = store.page_location(keys[2])
    with victim.open("r+b") as f:  # one flipped bit in the last byte of the third page
        f.seek(offset + nbytes - 1)
        last = f.read(1)[0]
        f.seek(offset + nbytes - 1)
        f.write(bytes([last ^ 0x01]))
    dest = cuda.zeros(len(keys) * PAGE, dtype=cuda.uint8, device="cuda")
    copy, finish = copier(cuda, name)
    assert gpu_restore.restore_to_gpu(store, keys, dest, copy) == 2
    finish()
    assert page_fills(cuda, dest) == [1, 2, 0, 0, 0, 0]
    assert store.match(keys) == 0 and not victim.exists()
