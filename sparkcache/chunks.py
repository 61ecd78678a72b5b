"""Content addresses of 256-token chunks, chained so that a key names its whole prefix.

Key i hashes key i-1 with chunk i's token ids: equal keys mean equal token prefixes, so the
longest run of leading keys found in the store is exactly the restorable prefix. The same
tokens give the same keys on every rank (the shared block identity DCP shards hang off).
"""

import hashlib
from array import array
from collections.abc import Sequence

from sparkcache import CHUNK_TOKENS

_ROOT = b"sparkcache-chunk-v1"


def chunk_keys(token_ids: Sequence[int], salt: str = "", chunk_tokens: int = CHUNK_TOKENS) -> list[str]:
    """Keys of every full chunk of `token_ids` (a trailing partial chunk has none).

    `salt` separates prompts whose equal tokens must not share KV (vLLM's cache_salt, LoRA).
    """
    parent = hashlib.sha256(_ROOT + salt.encode()).digest()
    keys = []
    for start in range(0, len(token_ids) - chunk_tokens + 1, chunk_tokens):
        tokens = array("q", token_ids[start : start + chunk_tokens]).tobytes()
        parent = hashlib.sha256(parent + tokens).digest()
        keys.append(parent.hex())
    return keys
