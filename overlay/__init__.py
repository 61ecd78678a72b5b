"""SparkRing's fail-closed vLLM overlay (docs/design.md §3.7).

A ``vllm.general_plugins`` entry point (``overlay.plugin:register``) that, in every vLLM
process, checks the sha256 of each upstream source file it patches against the overlay pins of
the image it runs in, and only then routes tensor-parallel collectives through the ring
transport. Any mismatch, missing pin or install failure stops the process (non-zero exit)
naming the patch; unsupported shapes, dtypes and groups use stock vLLM for that call.
"""

from overlay.registry import PATCHES, WRAPPED_RELEASES, Patch

__all__ = ["PATCHES", "WRAPPED_RELEASES", "Patch"]
