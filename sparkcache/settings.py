"""SparkCache's settings and the vLLM arguments that switch it on: one source for both.

`SPARKCACHE_ENABLED=1` (the launch profile's switch) adds `--kv-transfer-config` naming
this package's connector; `0` adds nothing, so the connector is absent and vLLM's own
prefix caching keeps working. Load failures must recompute, never fail the request, so the
rendered config always sets `kv_load_failure_policy: recompute` and the connector refuses
to start under any other policy.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkcache.store import StoreLimits

CONNECTOR_NAME = "SparkCacheConnector"
CONNECTOR_MODULE = "sparkcache.connector"
DEFAULT_ROOT = "/var/lib/sparkring/sparkcache"


def enabled(environ: dict[str, str] | None = None) -> bool:
    """SPARKCACHE_ENABLED: 1 (default) or 0; anything else is refused, not guessed."""
    value = (os.environ if environ is None else environ).get("SPARKCACHE_ENABLED", "1")
    if value not in ("0", "1"):
        raise ValueError(f"SPARKCACHE_ENABLED={value!r}: expected 1 (SparkCache on) or 0 (off)")
    return value == "1"


@dataclass(frozen=True)
class SparkCacheSettings:
    """What `kv_connector_extra_config` may hold (unknown keys are errors)."""

    root: Path = Path(DEFAULT_ROOT)
    max_bytes: int | None = None
    low_watermark: float = 0.8
    ttl_seconds: float | None = None
    reserve_bytes: int = 64 << 20
    model_revision: str | None = None  # default: sha256 of the model's config.json
    draft_revision: str = "none"
    # The geometry the launch profile intended; checked against vLLM's, never used instead of it.
    dcp: int | None = None
    kv_interleave: int | None = None

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any]) -> "SparkCacheSettings":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(
                f"kv_connector_extra_config: unknown key(s) {unknown}; expected some of {sorted(known)}"
            )
        values = {k: v for k, v in extra.items() if v is not None}  # null means "the default"
        if "root" in values:
            values["root"] = Path(values["root"])
        return cls(**values)

    def limits(self) -> StoreLimits:
        return StoreLimits(self.max_bytes, self.low_watermark, self.ttl_seconds, self.reserve_bytes)

    def extra_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"root": str(self.root)}
        for name in ("max_bytes", "ttl_seconds", "model_revision", "dcp", "kv_interleave"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("low_watermark", "reserve_bytes", "draft_revision"):
            if getattr(self, name) != SparkCacheSettings.__dataclass_fields__[name].default:
                out[name] = getattr(self, name)
        return out


def kv_transfer_config(settings: SparkCacheSettings) -> dict[str, Any]:
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": settings.extra_config(),
    }


def vllm_serve_args(settings: SparkCacheSettings, environ: dict[str, str] | None = None) -> list[str]:
    """The `vllm serve` arguments SparkCache contributes: none when it is switched off."""
    if not enabled(environ):
        return []
    return [
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(settings), sort_keys=True, separators=(",", ":")),
    ]
