"""Decode context parallel geometry: which rank holds which token's KV.

With DCP degree D and interleave I, token t lives on DCP rank (t // I) mod D. Every rank
stores and restores only its own tokens, under the chunk keys all ranks share.
"""


def token_owner(token: int, interleave: int, dcp_size: int) -> int:
    return (token // interleave) % dcp_size


def local_tokens(start: int, stop: int, dcp_rank: int, interleave: int, dcp_size: int) -> list[int]:
    """Global token positions in [start, stop) whose KV lives on `dcp_rank`, in order."""
    return [t for t in range(start, stop) if token_owner(t, interleave, dcp_size) == dcp_rank]


def local_slot(token: int, interleave: int, dcp_size: int) -> int:
    """Position of a rank's own token inside that rank's local KV sequence."""
    group, offset = divmod(token, interleave * dcp_size)
    return group * interleave + offset % interleave
