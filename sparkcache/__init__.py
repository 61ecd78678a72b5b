"""SparkCache: a persistent, crash-consistent, DCP-aware KV cache for vLLM.

Each rank keeps its own shard of KV pages on its local disk, addressed by the content of
the tokens they hold, and restores them after a restart instead of recomputing the
prefill. The store (`store`) is plain Python and bytes; only `connector` imports vLLM.
"""

CHUNK_TOKENS = 256
"""Tokens per stored chunk: one page per chunk per rank."""

GEOMETRY_NAMESPACE = "manager-pages-v2"
"""Bumped whenever the meaning of a page's bytes changes: old caches are then never read."""
