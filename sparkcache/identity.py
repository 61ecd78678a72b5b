"""The cache identity: everything that decides what a page's bytes mean.

Two processes share stored KV only if every field agrees; the store keeps each identity in
its own directory and checks the full record on open, so a cache written under another
geometry (model, dtype, layout, TP/DCP split, interleave, shard) is never read.
"""

import hashlib
import json
from dataclasses import asdict, dataclass

from sparkcache import CHUNK_TOKENS, GEOMETRY_NAMESPACE
from sparkcache.dcp import local_tokens

FORMAT_VERSION = 2
"""2: pages packed into one segment file per publication (1: one file per page)."""


@dataclass(frozen=True)
class CacheIdentity:
    """One rank's shard of one model's KV under one geometry."""

    model_revision: str
    draft_revision: str
    kv_dtype: str
    kv_layout: str
    block_size: int
    tp_size: int
    tp_rank: int
    dcp_size: int
    dcp_rank: int
    interleave: int
    namespace: str = GEOMETRY_NAMESPACE
    chunk_tokens: int = CHUNK_TOKENS
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} is outside tensor parallel size {self.tp_size}")
        if not 0 <= self.dcp_rank < self.dcp_size:
            raise ValueError(f"dcp_rank {self.dcp_rank} is outside DCP size {self.dcp_size}")
        if self.tp_size % self.dcp_size:
            raise ValueError(f"DCP size {self.dcp_size} must divide TP size {self.tp_size}")
        if self.interleave < 1 or self.block_size % self.interleave:
            raise ValueError(f"interleave {self.interleave} must divide the block size {self.block_size}")
        # Every DCP rank must hold the same number of each chunk's tokens ((t // I) mod D).
        if self.chunk_tokens % (self.interleave * self.dcp_size):
            raise ValueError(
                f"chunk of {self.chunk_tokens} tokens does not split evenly over DCP {self.dcp_size} "
                f"with interleave {self.interleave}"
            )
        # A chunk must be whole blocks on every DCP rank, or pages would split blocks.
        if self.chunk_tokens % (self.block_size * self.dcp_size):
            raise ValueError(
                f"chunk of {self.chunk_tokens} tokens is not whole blocks of {self.block_size} tokens "
                f"x DCP {self.dcp_size}: use a block size that divides {self.chunk_tokens // self.dcp_size}"
            )

    @property
    def blocks_per_chunk(self) -> int:
        """Scheduler (virtual) blocks per chunk; under DCP a block spans block_size x dcp tokens."""
        return self.chunk_tokens // (self.block_size * self.dcp_size)

    def shard_tokens(self, chunk: int) -> list[int]:
        """Global positions of chunk `chunk`'s tokens whose KV this rank's page holds."""
        start = chunk * self.chunk_tokens
        return local_tokens(start, start + self.chunk_tokens, self.dcp_rank, self.interleave, self.dcp_size)

    def record(self) -> dict[str, object]:
        return asdict(self)

    def canonical(self) -> bytes:
        return json.dumps(self.record(), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def dirname(self) -> str:
        return f"id-{self.digest()[:32]}"
