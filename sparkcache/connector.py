"""SparkCache as a vLLM V1 KV connector (written against vLLM 0.32.0's KVConnectorBase_V1).

Load it with `--kv-transfer-config` from `sparkcache.settings.vllm_serve_args`
(kv_connector_module_path = sparkcache.connector).

Scheduler side: chunk keys of the prompt -> how many leading chunks the store holds, agreed
by all ranks -> those tokens are "external"; after allocation the blocks they land in go to
the workers as load ops; when a prompt's full chunks are computed, a save op names their
blocks. Worker side: loads read and verify each page before it touches the paged cache (a
bad page reports its blocks as load errors: vLLM recomputes them); saves copy each layer's
blocks as the forward finishes the layer and a background thread publishes the snapshot.
"""

import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from sparkcache import CHUNK_TOKENS, settings
from sparkcache.agreement import LocalAgreement, RestoreAgreement
from sparkcache.chunks import chunk_keys
from sparkcache.identity import CacheIdentity
from sparkcache.metrics import SparkRingPromMetrics, SparkRingStats, Telemetry
from sparkcache.pages import LayerLayout, Page, PageError
from sparkcache.store import SparkCacheStore, publication_cause

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(f"vllm.{__name__}")  # under "vllm" so vLLM's log handlers print it


def _route_store_logs() -> None:
    """The store logs to "sparkcache" (it does not know vLLM): send that through vLLM's handlers."""
    store_logger = logging.getLogger("sparkcache")
    if not store_logger.handlers:
        store_logger.setLevel(logging.INFO)
        store_logger.propagate = False
        for handler in logging.getLogger("vllm").handlers:
            store_logger.addHandler(handler)


SUPPORTED_VLLM = ("0.32.",)
"""The KVConnectorBase_V1 revisions this file was read against (the hook names and the
recompute policy). Another version is refused rather than half-driven."""


@dataclass
class ChunkLoad:
    key: str
    block_ids: list[int]  # scheduler blocks of this chunk
    first: int  # blocks before this index are already computed locally


@dataclass
class LoadOp:
    req_id: str
    chunks: list[ChunkLoad]


@dataclass
class SaveOp:
    req_id: str
    keys: list[str]
    tokens: int
    block_ids: list[list[int]]  # per chunk


@dataclass
class SparkCacheMetadata(KVConnectorMetadata):
    loads: list[LoadOp] = field(default_factory=list)
    saves: list[SaveOp] = field(default_factory=list)


@dataclass
class _Tracked:
    """A running request as the scheduler side sees it."""

    keys: list[str]
    prompt_len: int
    block_ids: list[int]
    saved: bool = False


def _config_revision(path: str, revision: str | None) -> str:
    """A model's identity: its pinned revision, else the sha256 of its config.json."""
    if revision:
        return revision
    config = Path(path) / "config.json"
    if not config.is_file():
        raise ValueError(
            f"SparkCache: model {path!r} has no revision and no local config.json to hash; "
            "set kv_connector_extra_config.model_revision"
        )
    return "config-sha256:" + hashlib.sha256(config.read_bytes()).hexdigest()


def cache_identity(
    vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", conf: settings.SparkCacheSettings, role: str
) -> CacheIdentity:
    """Derive this process's identity from vLLM's configuration, refusing unsupported shapes."""
    par = vllm_config.parallel_config
    if par.pipeline_parallel_size != 1 or getattr(par, "prefill_context_parallel_size", 1) != 1:
        raise ValueError("SparkCache supports TP and DCP only (pipeline and prefill context parallel are 1)")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError(f"SparkCache supports one KV cache group; this model has {len(groups)}")
    spec = groups[0].kv_cache_spec
    model = vllm_config.model_config
    spec_conf = vllm_config.speculative_config
    draft = conf.draft_revision
    if draft == "none" and spec_conf is not None and spec_conf.draft_model_config is not None:
        dm = spec_conf.draft_model_config
        draft = _config_revision(dm.model, dm.revision)
    cache_dtype = vllm_config.cache_config.cache_dtype
    kv_dtype = str(model.dtype) if cache_dtype == "auto" else str(cache_dtype)
    layout = (
        f"{type(spec).__name__}:heads={getattr(spec, 'num_kv_heads', '?')}:"
        f"head={getattr(spec, 'head_size', '?')}:layers={len(groups[0].layer_names)}:"
        f"page_bytes={spec.page_size_bytes}"
    )
    tp_rank = dcp_rank = 0
    dcp_size = par.decode_context_parallel_size
    if role == "worker":
        from vllm.distributed.parallel_state import get_dcp_group, get_tensor_model_parallel_rank

        tp_rank = get_tensor_model_parallel_rank()
        dcp_rank = get_dcp_group().rank_in_group if dcp_size > 1 else 0
    interleave = getattr(par, "cp_kv_cache_interleave_size", None) or getattr(
        par, "dcp_kv_cache_interleave_size", 1
    )
    for name, declared, actual in (
        ("dcp", conf.dcp, dcp_size),
        ("kv_interleave", conf.kv_interleave, interleave),
    ):
        if declared is not None and declared != actual:
            raise ValueError(
                f"kv_connector_extra_config.{name}={declared} contradicts vLLM's {actual}: "
                "fix the launch profile or the vLLM flags"
            )
    return CacheIdentity(
        model_revision=conf.model_revision or _config_revision(model.model, model.revision),
        draft_revision=draft,
        kv_dtype=kv_dtype,
        kv_layout=layout,
        block_size=vllm_config.cache_config.block_size,
        tp_size=par.tensor_parallel_size,
        tp_rank=tp_rank,
        dcp_size=dcp_size,
        dcp_rank=dcp_rank,
        interleave=interleave,
    )


class SparkCacheConnector(KVConnectorBase_V1):
    _cache_hit_source = CacheHitSource.DISK

    def __init__(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _route_store_logs()
        if not vllm.__version__.startswith(SUPPORTED_VLLM):
            raise RuntimeError(
                f"SparkCache connector targets vLLM {SUPPORTED_VLLM}, found {vllm.__version__}: "
                "re-read KVConnectorBase_V1 for this version before enabling it"
            )
        if not settings.enabled():
            raise RuntimeError("SPARKCACHE_ENABLED=0 but the SparkCache connector was configured: drop it")
        policy = self._kv_transfer_config.kv_load_failure_policy
        if policy != "recompute":
            raise ValueError(
                f"kv_load_failure_policy={policy!r}: SparkCache needs 'recompute' so a bad page is "
                "recomputed instead of failing the request (sparkcache.settings renders it)"
            )
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._conf = settings.SparkCacheSettings.from_extra_config(extra)
        side = "worker" if role == KVConnectorRole.WORKER else "scheduler"
        self._identity = cache_identity(vllm_config, kv_cache_config, self._conf, side)
        self._block_tokens = self._identity.block_size * self._identity.dcp_size
        self._bpc = self._identity.blocks_per_chunk
        self._store = SparkCacheStore(
            self._conf.root, self._identity, self._conf.limits(), writer=side == "worker"
        )
        logger.info(
            "SparkCache %s: store %s (identity %s, %d snapshot(s))",
            side,
            self._store.dir,
            self._identity.digest()[:16],
            len(self._store.snapshots()),
        )
        # scheduler side
        self._agreement: RestoreAgreement = LocalAgreement()
        self._keys: dict[str, list[str]] = {}
        self._matched: dict[str, tuple[int, int]] = {}
        self._to_load: dict[str, tuple[int, int]] = {}
        self._tracked: dict[str, _Tracked] = {}
        # worker side
        self._caches: dict[str, torch.Tensor] = {}
        self._ratio = 1
        self._staged: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
        self._invalid: set[int] = set()
        self._queue: queue.Queue[tuple[list[str], int, dict[str, Page]] | None] = queue.Queue()
        self._publisher: threading.Thread | None = None
        # What /metrics shows (sparkcache/metrics.py): this worker's events and the overlay's counters.
        self._telemetry = Telemetry(self._identity.tp_rank) if side == "worker" else None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is only a later miss

    # ================================ scheduler side ================================
    def set_agreement(self, agreement: RestoreAgreement) -> None:
        """Install the all-ranks agreement (the launch's rank group on multi-node TP)."""
        self._agreement = agreement

    def _request_keys(self, request: "Request") -> list[str]:
        keys = self._keys.get(request.request_id)
        if keys is None:
            lora = getattr(request, "lora_request", None)
            parts = [getattr(request, "cache_salt", None) or "", lora.lora_name if lora else ""]
            salt = "|".join(parts) if any(parts) else ""  # unsalted keys equal chunk_keys(tokens)
            keys = chunk_keys(request.prompt_token_ids or [], salt)
            self._keys[request.request_id] = keys
        return keys

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        # Token ids do not describe multimodal or embedding inputs: never restore those.
        if request.mm_features or getattr(request, "prompt_embeds", None) is not None:
            return 0, False
        prompt_len = len(request.prompt_token_ids or [])
        limit = (prompt_len - 1) // CHUNK_TOKENS  # the last prompt token is always computed
        if limit <= 0:
            return 0, False
        keys = self._request_keys(request)[:limit]
        self._store.refresh()
        local = self._store.match(keys)
        agreed = min(local, self._agreement.agree(request.request_id, keys, local)) if local else 0
        matched = agreed * CHUNK_TOKENS
        if matched <= num_computed_tokens:
            self._matched.pop(request.request_id, None)
            return 0, False
        self._matched[request.request_id] = (num_computed_tokens, matched - num_computed_tokens)
        return matched - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            local, _ = self._matched.get(request.request_id, (0, 0))
            self._to_load[request.request_id] = (local, num_external_tokens)
            logger.info(
                "SparkCache: restoring %d tokens for request %s", num_external_tokens, request.request_id
            )

    def _load_op(self, req_id: str, tracked: _Tracked, local: int, external: int) -> LoadOp:
        chunks = []
        for i in range(local // CHUNK_TOKENS, (local + external) // CHUNK_TOKENS):
            blocks = tracked.block_ids[i * self._bpc : (i + 1) * self._bpc]
            first = max(0, local - i * CHUNK_TOKENS) // self._block_tokens
            chunks.append(ChunkLoad(tracked.keys[i], blocks, first))
        return LoadOp(req_id, chunks)

    def _maybe_save(self, meta: SparkCacheMetadata, req_id: str, tracked: _Tracked, computed: int) -> None:
        full = min(tracked.prompt_len // CHUNK_TOKENS, len(tracked.keys))
        if tracked.saved or full == 0 or computed < full * CHUNK_TOKENS:
            return
        tracked.saved = True
        if len(tracked.block_ids) < full * self._bpc:
            return
        blocks = [tracked.block_ids[i * self._bpc : (i + 1) * self._bpc] for i in range(full)]
        meta.saves.append(SaveOp(req_id, tracked.keys[:full], full * CHUNK_TOKENS, blocks))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = SparkCacheMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            prompt = new.prompt_token_ids or []
            keys = self._keys.get(new.req_id, [])  # set by get_num_new_matched_tokens
            tracked = _Tracked(keys, len(prompt), list(new.block_ids[0]))
            self._tracked[new.req_id] = tracked
            if new.req_id in self._to_load:
                meta.loads.append(self._load_op(new.req_id, tracked, *self._to_load.pop(new.req_id)))
            self._maybe_save(meta, new.req_id, tracked, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_blocks[0]) if new_blocks else []
            elif new_blocks:
                tracked.block_ids.extend(new_blocks[0])
            if req_id in self._to_load:
                meta.loads.append(self._load_op(req_id, tracked, *self._to_load.pop(req_id)))
            self._maybe_save(meta, req_id, tracked, cached.num_computed_tokens[i] + scheduled[req_id])
        self._to_load.clear()
        return meta

    def request_finished(
        self, request: "Request", block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        for table in (self._keys, self._matched, self._to_load, self._tracked):
            table.pop(request.request_id, None)
        return False, None

    # ================================= worker side ==================================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Keep the per-layer views (blocks at dim 0); vLLM may split a scheduler block into
        several kernel blocks, so a block id maps to `ratio` consecutive leading rows."""
        num_blocks = self._kv_cache_config.num_blocks
        self._caches = dict(sorted(kv_caches.items()))
        ratios = {t.shape[0] // num_blocks for t in self._caches.values()}
        if len(ratios) != 1 or any(t.shape[0] % num_blocks for t in self._caches.values()):
            raise ValueError(f"SparkCache: KV layers do not share a multiple of {num_blocks} blocks")
        self._ratio = ratios.pop()
        self._publisher = threading.Thread(target=self._publish_loop, name="sparkcache-publish", daemon=True)
        self._publisher.start()

    def _rows(self, block_ids: list[int], device: torch.device) -> torch.Tensor:
        rows = [b * self._ratio + j for b in block_ids for j in range(self._ratio)]
        return torch.tensor(rows, dtype=torch.long, device=device)

    def _gather(self, kv: torch.Tensor, block_ids: list[int]) -> torch.Tensor:
        return kv.index_select(0, self._rows(block_ids, kv.device)).to("cpu", copy=True).contiguous()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SparkCacheMetadata)
        for op in meta.loads:
            self._load(op)

    def _load(self, op: LoadOp) -> None:
        """Verify each page before it touches the paged cache; from the first bad page on,
        every block of the request is reported for recompute."""
        loaded = verified = 0
        started = time.perf_counter()
        pages = self._store.read_pages([chunk.key for chunk in op.chunks])
        for n, (chunk, page) in enumerate(zip(op.chunks, pages, strict=True)):
            try:
                if isinstance(page, PageError):
                    self._count("sparkcache_pages", event="quarantined")  # the store removed it
                    raise page
                self._count("sparkcache_pages", event="verified")
                tensors = self._unpack(page)
            except PageError as exc:
                bad = [b for c in op.chunks[n:] for b in c.block_ids[c.first :]]
                self._invalid.update(bad)
                logger.warning(
                    "SparkCache: request %s: %s; %d block(s) will be recomputed", op.req_id, exc, len(bad)
                )
                break
            for name, kv in self._caches.items():
                src = tensors[name][chunk.first * self._ratio :]
                kv.index_copy_(0, self._rows(chunk.block_ids[chunk.first :], kv.device), src.to(kv.device))
            loaded += (len(chunk.block_ids) - chunk.first) * self._block_tokens
            verified += 1
            self._count("sparkcache_pages", event="restored")
            self._count("sparkcache_restore_bytes", len(page.payload))
        self._count("sparkcache_restore_seconds", time.perf_counter() - started)
        if verified:
            self._store.touch(op.chunks[verified - 1].key)
        logger.info(
            "SparkCache: loaded %d tokens (%d page(s) verified) for request %s", loaded, verified, op.req_id
        )

    def _unpack(self, page: Page) -> dict[str, torch.Tensor]:
        """Split a verified page into per-layer tensors, refusing any layout mismatch."""
        if [layer.name for layer in page.layers] != list(self._caches):
            raise PageError(f"page {page.key[:16]}: layers differ from this model's")
        raw = torch.frombuffer(page.payload, dtype=torch.uint8)  # a view of the verified read buffer
        out, offset = {}, 0
        for layer in page.layers:
            kv = self._caches[layer.name]
            expect = (self._bpc * self._ratio, *kv.shape[1:])
            if layer.dtype != str(kv.dtype) or tuple(layer.shape) != expect:
                raise PageError(f"page {page.key[:16]}: layer {layer.name} layout differs")
            out[layer.name] = raw[offset : offset + layer.nbytes].view(kv.dtype).view(expect)
            offset += layer.nbytes
        return out

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete inside start_load_kv

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any
    ) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SparkCacheMetadata)
        for op in meta.saves:
            staged = self._staged.setdefault(op.req_id, {})
            for key, blocks in zip(op.keys, op.block_ids, strict=True):
                if key in self._store.missing([key]):
                    staged.setdefault(key, {})[layer_name] = self._gather(kv_layer, blocks)

    def wait_for_save(self) -> None:
        """Hand each finished prompt's pages to the publisher; layers the forward did not
        report are copied from the registered caches (the blocks are still this step's)."""
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, SparkCacheMetadata)
        for op in meta.saves:
            staged = self._staged.pop(op.req_id, {})
            pages = {}
            for key, blocks in zip(op.keys, op.block_ids, strict=True):
                if key not in self._store.missing([key]):
                    continue
                layers = staged.get(key, {})
                tensors = [
                    layers.get(n) if n in layers else self._gather(kv, blocks)
                    for n, kv in self._caches.items()
                ]
                pages[key] = self._pack(key, tensors)
            self._queue.put((op.keys, op.tokens, pages))
        self._staged.clear()

    def _pack(self, key: str, tensors: list[torch.Tensor]) -> Page:
        layouts, parts = [], []
        for name, t in zip(self._caches, tensors, strict=True):
            data = t.view(-1).view(torch.uint8).numpy().tobytes()
            layouts.append(LayerLayout(name, str(t.dtype), tuple(t.shape), len(data)))
            parts.append(data)
        return Page(key, self._store.digest, tuple(layouts), b"".join(parts))

    def _publish_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            keys, tokens, pages = item
            try:
                result = self._store.publish(keys, tokens, pages)
            except Exception as exc:  # serving must outlive any publication bug
                logger.exception("SparkCache: publication of %s failed", keys[-1][:16])
                self._count("sparkcache_publication_failures", reason=publication_cause(exc))
                continue
            if result.status == "published":
                self._count("sparkcache_pages", len(pages), event="stored")
            elif result.status == "skipped":
                self._count("sparkcache_publication_failures", reason=result.cause)
            self._count("sparkcache_evictions", len(result.evicted))
            logger.info(
                "SparkCache: snapshot %s (%d tokens) %s%s",
                keys[-1][:16],
                tokens,
                result.status,
                f": {result.reason}" if result.reason else "",
            )

    def _count(self, family: str, n: float = 1, **labels: object) -> None:
        if self._telemetry is not None and n:
            self._telemetry.count(family, n, **labels)

    def get_kv_connector_stats(self) -> SparkRingStats | None:
        """This worker's counters since its last report; vLLM sums them over the ring's workers."""
        delta = self._telemetry.delta() if self._telemetry is not None else {}
        return SparkRingStats(data=delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> SparkRingStats:
        return SparkRingStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: "VllmConfig",
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> SparkRingPromMetrics:
        return SparkRingPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_block_ids_with_load_errors(self) -> set[int]:
        bad, self._invalid = self._invalid, set()
        return bad

    def shutdown(self) -> None:
        if self._publisher is not None:
            self._queue.put(None)
            self._publisher.join(timeout=60)
        self._store.close()
