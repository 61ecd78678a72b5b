#!/usr/bin/env python3
"""Attest inside the container, then exec vLLM (docs/design.md §3.5: nothing starts unattested).

The build wrote /opt/sparkring/image.json: the lock's sha256, the vLLM version, the sha256 of
every file of the transport, overlay and SparkCache sources installed in the image, and of the
patched NCCL library on GB10. Before vLLM starts this checks each of them against the bytes
actually present, prints one attestation record (JSON, one line, on stderr; also written to
$SPARKRING_ATTEST_PATH when set) and only then execs `vllm ARGS...`. Any mismatch exits 78
(EX_CONFIG) naming the file: a silently altered image never serves.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata

# The image's copy of module_utils/sparkring_integrity.py, beside this file (the script's folder
# is on the path): the same hashing and secret names as everywhere else.
from sparkring_integrity import redact_env, sha256_file

IMAGE_JSON = os.environ.get("SPARKRING_IMAGE_JSON", "/opt/sparkring/image.json")
EX_CONFIG = 78


def attest(image: dict) -> tuple[dict, list[str]]:
    """The record and the list of problems (empty means attested)."""
    problems = []
    root = image["files_root"]
    for name, expected in sorted(image["files"].items()):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            problems.append(f"{path}: missing (the image expects sha256 {expected})")
        elif sha256_file(path) != expected:
            problems.append(f"{path}: sha256 differs from the build record")
    nccl = image.get("nccl")
    nccl_actual = None
    if nccl:
        nccl_actual = sha256_file(nccl["path"]) if os.path.isfile(nccl["path"]) else None
        if nccl_actual != nccl["sha256"]:
            problems.append(f"{nccl['path']}: sha256 {nccl_actual} != patched NCCL {nccl['sha256']}")
    try:
        vllm_version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        vllm_version = None
    if vllm_version != image["vllm_version"]:
        problems.append(f"vllm {vllm_version} installed, the image was built for {image['vllm_version']}")
    env = redact_env(
        {key: value for key, value in os.environ.items() if key.startswith(("SPARKRING_", "VLLM_", "NCCL_"))}
    )
    record = {
        "lock_sha256": image["lock_sha256"],
        "sources_sha256": image["sources_sha256"],
        "vllm_version": vllm_version,
        "nccl_sha256": nccl_actual,
        "files_checked": len(image["files"]),
        "argv": ["vllm", *sys.argv[1:]],
        "env": env,
        "attested": not problems,
    }
    return record, problems


def main() -> int:
    try:
        with open(IMAGE_JSON, encoding="utf-8") as handle:
            image = json.load(handle)
    except (OSError, ValueError) as error:
        print(
            f"sparkring entrypoint: cannot read {IMAGE_JSON}: {error}; not a SparkRing image", file=sys.stderr
        )
        return EX_CONFIG
    record, problems = attest(image)
    line = json.dumps(record, sort_keys=True)
    print(line, file=sys.stderr, flush=True)
    target = os.environ.get("SPARKRING_ATTEST_PATH")
    if target:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
    if problems:
        for problem in problems:
            print(f"sparkring entrypoint: {problem}", file=sys.stderr)
        print("sparkring entrypoint: attestation failed, vLLM not started", file=sys.stderr)
        return EX_CONFIG
    if os.environ.get("SPARKRING_ATTEST_ONLY") == "1":
        return 0
    os.execvp("vllm", ["vllm", *sys.argv[1:]])
    return EX_CONFIG  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
