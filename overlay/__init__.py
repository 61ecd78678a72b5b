"""SparkRing's fail-closed vLLM overlay (docs/design.md §3.7).

A ``vllm.general_plugins`` entry point (``overlay.plugin:register``) that, in every vLLM
process, checks the sha256 of each upstream source file it patches for the vLLM version it
knows, and only then routes tensor-parallel collectives through the ring transport. Any
mismatch or install failure stops the process (non-zero exit) naming the patch; unsupported
shapes, dtypes and groups use stock vLLM for that call.
"""

from overlay.registry import KNOWN_VLLM_VERSIONS, PATCHES, Patch

__all__ = ["KNOWN_VLLM_VERSIONS", "PATCHES", "Patch"]
