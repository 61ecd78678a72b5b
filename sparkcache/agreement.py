"""All ranks must agree on a restore before the scheduler admits it.

Each rank holds only its own shard, so a prefix is restorable only as far as the shortest
run every rank has. The scheduler asks an agreement for that minimum; on one process the
answer is the local count. A multi-node agreement (the launch's rank group) implements the
same protocol and must answer with the minimum over all ranks, or 0 when any rank is
unreachable: a wrong answer here would load another rank's missing KV as garbage.
"""

from typing import Protocol


class RestoreAgreement(Protocol):
    def agree(self, request_id: str, chunk_keys: list[str], local_chunks: int) -> int:
        """Leading chunks of `chunk_keys` that every rank can restore (<= local_chunks)."""
        ...


class LocalAgreement:
    """The single-rank agreement: this rank is all ranks."""

    def agree(self, request_id: str, chunk_keys: list[str], local_chunks: int) -> int:
        return local_chunks
