"""The launch profile: the one file a user edits to serve a model (docs/design.md §3.2).

A profile is an environment file (`inventories/<cluster>/launch.env`, KEY=VALUE lines). It is
parsed strictly (unknown keys, duplicate keys and malformed lines are errors naming the line),
validated with pydantic, and completed by `dcp_geometry`, the one function that owns the
topology-aware defaults. An explicit value that contradicts the geometry is an error, because
a DCP4 launch with one-token interleaving starts fine and serves wrong KV.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

GIB = 1024**3
_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9 _./:=,@+%{}\"\[\]-]*$")
_PATH = re.compile(r"^/[A-Za-z0-9_./@+-]*$")
# Keys that once existed, and why they are gone (an edited old profile gets the reason, not "unknown").
REMOVED_KEYS = {
    "full_ckv_gather": "removed: vLLM gathers the compressed KV across the DCP ranks whenever DCP > 1 and has "
    "no switch for it, so the key had no effect; delete the line",
}


class ProfileError(ValueError):
    """A launch profile that cannot be used; every line names the key (or line) and the fix."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class DcpGeometry:
    """What a decode-context-parallel degree implies for the KV cache layout."""

    kv_interleave: int
    kv_cache_gib: int


def dcp_geometry(dcp: int) -> DcpGeometry:
    """The topology-aware defaults (reference 000): DCP1 keeps whole tokens on each rank;
    DCP2/4 shard the KV by 4-token interleave. The full compressed-KV gather DCP2/4 need is not
    a setting: vLLM gathers the compressed (MLA) KV across the DCP ranks whenever DCP > 1."""
    if dcp == 1:
        return DcpGeometry(kv_interleave=1, kv_cache_gib=26)
    if dcp in (2, 4):
        return DcpGeometry(kv_interleave=4, kv_cache_gib=30)
    raise ProfileError([f"DCP: {dcp} is not supported, expected 1, 2 or 4"])


def _bool01(value: object) -> object:
    """Env files say 0/1; accept exactly those (and real booleans from Python callers)."""
    if isinstance(value, bool):
        return value
    if value in ("0", "1", 0, 1):
        return value in ("1", 1)
    raise ValueError("expected 0 or 1")


class LaunchProfile(BaseModel):
    """The validated profile. Field names are the env-file keys, lower-cased."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str
    model_revision: str = Field(min_length=1)
    served_model_name: str | None = None
    draft_path: str | None = None
    draft_revision: str | None = None
    tp: int | None = Field(default=None, ge=1)
    dcp: int = 1
    kv_interleave: int | None = Field(default=None, ge=1)
    kv_cache_gib: int | None = Field(default=None, ge=1)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "bfloat16", "float32"] = (
        "fp8"
    )
    max_model_len: int = Field(default=1_048_576, ge=1)
    max_num_batched_tokens: int = Field(default=8_192, ge=1)
    spec_method: Literal["none", "mtp", "ngram", "draft_model"] = "none"
    spec_tokens: int = 4
    spec_adaptive: bool = False
    spec_adaptive_window: int = Field(default=32, ge=1)
    api_port: int = Field(default=8000, ge=1, le=65535)
    master_port: int = Field(default=29500, ge=1, le=65535)
    sparkcache_enabled: bool = True
    sparkcache_dir: str = "/var/lib/sparkring/sparkcache"
    sparkcache_max_gib: int = Field(default=512, ge=1)
    sparkcache_low_watermark: float = Field(default=0.8, gt=0, lt=1)
    sparkcache_ttl_hours: int = Field(default=168, ge=1)
    nccl_mode: Literal["patched", "patch-free", "none"] = "patched"
    overlay_mode: Literal["disabled", "shadow", "custom"] = "custom"
    extra_vllm_args: str = ""

    @field_validator("spec_adaptive", "sparkcache_enabled", mode="before")
    @classmethod
    def _zero_or_one(cls, value: object) -> object:
        return _bool01(value)

    @field_validator("dcp")
    @classmethod
    def _supported_dcp(cls, value: int) -> int:
        if value not in (1, 2, 4):
            raise ValueError("expected 1, 2 or 4")
        return value

    @field_validator("spec_tokens")
    @classmethod
    def _supported_depth(cls, value: int) -> int:
        if value not in (2, 4):
            raise ValueError("expected 2 or 4 speculative tokens per round")
        return value

    @field_validator("model_path", "draft_path", "sparkcache_dir")
    @classmethod
    def _absolute_path(cls, value: str | None) -> str | None:
        if value is not None and not _PATH.match(value):
            raise ValueError("expected an absolute path of letters, digits and _./@+-")
        return value

    @field_validator("extra_vllm_args", "served_model_name", "model_revision", "draft_revision")
    @classmethod
    def _shell_safe(cls, value: str | None) -> str | None:
        if value is not None and not _SAFE_VALUE.match(value):
            raise ValueError("contains characters that are not allowed (no quotes, $, `, ;, |, & or \\)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LaunchProfile:
        errors: list[str] = []
        geometry = dcp_geometry(self.dcp)
        if self.kv_interleave is not None and self.kv_interleave != geometry.kv_interleave:
            errors.append(
                f"KV_INTERLEAVE: {self.kv_interleave} contradicts DCP={self.dcp}, "
                f"which needs {geometry.kv_interleave} (remove the key to take the default)"
            )
        if self.tp is not None and self.tp % self.dcp:
            errors.append(f"TP: {self.tp} is not a multiple of DCP={self.dcp}")
        if self.draft_path and not self.draft_revision:
            errors.append("DRAFT_REVISION: required when DRAFT_PATH is set (pin the draft's revision)")
        if self.spec_method == "draft_model" and not self.draft_path:
            errors.append("SPEC_METHOD: draft_model needs DRAFT_PATH")
        if self.max_num_batched_tokens > self.max_model_len:
            errors.append("MAX_NUM_BATCHED_TOKENS: larger than MAX_MODEL_LEN")
        if self.api_port == self.master_port:
            errors.append("MASTER_PORT: must differ from API_PORT")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def geometry(self) -> DcpGeometry:
        """The effective geometry (explicit values already proved consistent)."""
        default = dcp_geometry(self.dcp)
        return DcpGeometry(
            kv_interleave=default.kv_interleave,
            kv_cache_gib=self.kv_cache_gib or default.kv_cache_gib,
        )

    def for_world(self, world_size: int) -> LaunchProfile:
        """Bind the profile to a cluster: TP is one GPU per rank, so it must equal the ranks."""
        tp = self.tp if self.tp is not None else world_size
        if tp != world_size:
            raise ProfileError([f"TP: {tp} but the cluster has {world_size} ranks (TP is one rank per GPU)"])
        if tp % self.dcp:
            raise ProfileError([f"DCP: {self.dcp} does not divide TP={tp}"])
        return self.model_copy(update={"tp": tp})

    def digest(self) -> str:
        """sha256 of the effective profile: what attestation compares across ranks."""
        effective = self.model_dump(mode="json") | {"geometry": self.geometry.__dict__}
        return hashlib.sha256(json.dumps(effective, sort_keys=True).encode()).hexdigest()


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines, `#` comments, optional single or double quotes around a value.

    Strict on purpose: a duplicate key or a line that is not an assignment is an error,
    not a silent last-one-wins."""
    values: dict[str, str] = {}
    errors: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            errors.append(f"line {number}: expected KEY=VALUE with an upper-case KEY, got {raw!r}")
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if key in values:
            errors.append(f"line {number}: {key} is set twice")
            continue
        values[key] = value
    if errors:
        raise ProfileError(errors)
    return values


def load_profile(values: dict[str, str]) -> LaunchProfile:
    """Validate env-file values; errors name the env key, never a Python field name."""
    try:
        return LaunchProfile.model_validate({key.lower(): value for key, value in values.items()})
    except ValidationError as exc:
        lines = [line for error in exc.errors() for line in _describe(error).splitlines()]
        raise ProfileError(lines) from None


def load_profile_file(path: str | Path) -> LaunchProfile:
    """Read and validate `launch.env`; the path is named in every error."""
    try:
        return load_profile(parse_env_file(Path(path).read_text(encoding="utf-8")))
    except ProfileError as exc:
        raise ProfileError([f"{path}: {error}" for error in exc.errors]) from None


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and location in REMOVED_KEYS:
        return f"{location.upper()}: {REMOVED_KEYS[location]}"
    if error["type"] == "extra_forbidden":
        return f"{location.upper()}: unknown key (docs/launch.md lists the keys)"
    if not location:
        return message  # cross-field rules already name their keys
    return f"{location.upper()}: {message} (got {error.get('input')!r})"
