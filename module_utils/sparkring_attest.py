"""Attestation records for the per-rank launch (docs/design.md §3.5): build, redact, compare.

Standard library only: this file travels to every rank with the module. The record is the one
description of what a rank is about to run; `comparable` is the one definition of which parts of
it are rank-specific (everything else must agree across ranks, or no rank starts).
"""

from __future__ import annotations

import hashlib
import json

try:  # inside an Ansible module
    from ansible.module_utils.sparkring_integrity import REDACTED, is_secret_name
except ImportError:  # imported or run from module_utils/ itself (tests, scripts)
    from sparkring_integrity import REDACTED, is_secret_name

SCHEMA = 1
RANK_MASK = "<rank-specific>"

# Environment derived from the rank's own inventory entry (its address, its NICs, its core).
RANK_ENV = frozenset(
    {
        "VLLM_HOST_IP",
        "SPARKRING_RANK",
        "VLLM_CPU_OMP_THREADS_BIND",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
    }
)
RANK_LABELS = frozenset({"sparkring.rank"})
# argv flags whose value is the rank's own (masked), and the API binding only rank 0 has (dropped).
RANK_VALUE_FLAGS = frozenset({"--name", "--node-rank"})
HEAD_ONLY_FLAGS = frozenset({"--host", "--port"})
WORKER_ONLY_FLAGS = frozenset({"--headless"})

# Runs INSIDE the image (`docker run --rm --network none --workdir /opt/sparkring --entrypoint python3
# IMAGE -c ...`), so the hashes are of the bytes the container will load, not of the host's copies;
# the hashing is the image's own copy of sparkring_integrity (beside the entrypoint, on the path as
# the working directory).
# argv: the NCCL library path (empty: the one the image's image.json records), the package
# names, then `--vllm` and the vLLM files the overlay pins (paths under the directory holding the
# vllm package; vLLM is found, never imported). Prints one JSON object.
IMAGE_PROBE = r"""
import importlib.util, json, os, sys
from sparkring_integrity import package_files, sha256_file, tree_sha256

image_json = "/opt/sparkring/image.json"
image = {}
if os.path.isfile(image_json):
    with open(image_json, encoding="utf-8") as handle:
        image = json.load(handle)
nccl = sys.argv[1] or (image.get("nccl") or {}).get("path")
out = {"python": sys.executable, "nccl": {"path": nccl, "sha256": None}, "packages": {}}
if nccl and os.path.isfile(nccl):
    out["nccl"]["sha256"] = sha256_file(nccl)
args = sys.argv[2:]
packages, vllm_files = (args[: args.index("--vllm")], args[args.index("--vllm") + 1 :]) if "--vllm" in args else (args, [])
for name in packages:
    spec = importlib.util.find_spec(name)
    places = list(spec.submodule_search_locations or []) if spec else []
    top = places[0] if places else None
    out["packages"][name] = {"path": top, "sha256": tree_sha256(top, package_files(top)) if top else None}
out["image_json_sha256"] = sha256_file(image_json) if os.path.isfile(image_json) else None
if vllm_files:
    from importlib import metadata
    spec = importlib.util.find_spec("vllm")
    top = os.path.dirname(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        version = None
    found = {f: sha256_file(os.path.join(top, f)) if top and os.path.isfile(os.path.join(top, f)) else None for f in vllm_files}
    out["vllm"] = {"version": version, "files": found, "image_json_overlay_pins": image.get("overlay_pins")}
print(json.dumps(out, sort_keys=True))
"""


def redact_argv(argv: list[str]) -> list[str]:
    """`--env NAME=value` with a secret NAME keeps the name only (the renderer never emits one;
    this is the guard should a hand-written extra flag try)."""
    redacted = []
    for token in argv:
        name, sep, _value = token.partition("=")
        redacted.append(f"{name}={REDACTED}" if sep and is_secret_name(name) and name.isupper() else token)
    return redacted


def digest(value: object) -> str:
    """sha256 of canonical JSON: the identity of a record or of one of its parts."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def mask_argv(argv: list[str]) -> list[str]:
    """The argv with rank-specific values masked and role-only flags removed."""
    masked: list[str] = []
    skip_value = False
    for index, token in enumerate(argv):
        previous = argv[index - 1] if index else ""
        if skip_value:
            skip_value = False
            continue
        if token in HEAD_ONLY_FLAGS:
            skip_value = True
            continue
        if token in WORKER_ONLY_FLAGS:
            continue
        if previous in RANK_VALUE_FLAGS:
            masked.append(RANK_MASK)
            continue
        name, sep, _value = token.partition("=")
        rank_env = previous in ("--env", "-e") and name in RANK_ENV
        rank_label = previous in ("--label", "-l") and name in RANK_LABELS
        if sep and (rank_env or rank_label):
            masked.append(f"{name}={RANK_MASK}")
        else:
            masked.append(token)
    return masked


def comparable(record: dict) -> dict:
    """The parts of a record that must be identical on every rank."""
    return {
        "schema": record["schema"],
        "image": record["image"],
        "image_files": record["image_files"],
        "profile_sha256": record["profile_sha256"],
        "mounts": [
            {**mount, "manifest_sha256": RANK_MASK} if mount.get("rank_specific") else mount
            for mount in record["mounts"]
        ],
        "env": {key: value for key, value in record["env"].items() if key not in RANK_ENV},
        "labels": {key: value for key, value in record["labels"].items() if key not in RANK_LABELS},
        "secret_env_names": record["secret_env_names"],
        "argv": mask_argv(record["argv"]),
    }


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists by index, so a field names its exact place."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((f"[{index}]", item) for index, item in enumerate(value))
    else:
        return {prefix: value}
    flat: dict[str, object] = {}
    for key, item in items:
        joined = f"{prefix}{key}" if str(key).startswith("[") else (f"{prefix}.{key}" if prefix else str(key))
        flat.update(_flatten(item, joined))
    return flat


def disagreements(records: list[dict]) -> list[str]:
    """One line per field on which the ranks do not agree: the field, each value and its ranks.

    Empty means every rank is about to run the same thing (up to rank-specific values)."""
    if not records:
        return ["no attestation records: every rank must attest before any starts"]
    ranks = sorted(record["rank"] for record in records)
    problems = []
    if len(set(ranks)) != len(ranks):
        problems.append(f"rank: duplicate attestation records for ranks {ranks}")
    flat = {record["rank"]: _flatten(comparable(record)) for record in records}
    fields = sorted({field for values in flat.values() for field in values})
    for field in fields:
        groups: dict[str, list[int]] = {}
        for rank in ranks:
            shown = json.dumps(flat[rank].get(field, "<absent>"), sort_keys=True)
            groups.setdefault(shown, []).append(rank)
        if len(groups) > 1:
            parts = "; ".join(
                f"ranks {','.join(map(str, members))}: {value}"
                for value, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[1]))
            )
            problems.append(f"{field} differs across ranks ({parts})")
    return problems
