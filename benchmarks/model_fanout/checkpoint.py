"""A multi-file checkpoint for the model stage's sim tests and benchmark, generated here.

    .venv/bin/python -m benchmarks.model_fanout.checkpoint OUT_DIR --total-mib 2048 --shards 4

Real safetensors shards (an 8-byte header length, a JSON header, one U8 tensor each) named and
indexed as a hub checkpoint names them (`model-0000i-of-0000n.safetensors`,
`model.safetensors.index.json`), plus a config and a tokenizer-sized file. The bytes follow from
the arguments alone (SHAKE-256 of a seed, stdlib only), so the same arguments give the same
files and manifest on any machine, in about the time it takes to write them. Prints the
manifest (path, size, sha256 of every file) as JSON, the shape the lock's models entries pin.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path

PIECE = 16 * 1024 * 1024  # bytes generated (and hashed) at a time


def _write(path: Path, chunks) -> dict:
    digest, size = hashlib.sha256(), 0
    with path.open("wb") as out:
        for data in chunks:
            out.write(data)
            digest.update(data)
            size += len(data)
    return {"size": size, "sha256": digest.hexdigest()}


def _shard(name: str, tensor: str, size: int, seed: str):
    """A safetensors file holding one U8 tensor of `size` bytes drawn from SHAKE-256(seed, piece)."""
    header = json.dumps({tensor: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)  # the format pads the header to 8 bytes
    yield struct.pack("<Q", len(header)) + header
    for index, start in enumerate(range(0, size, PIECE)):
        yield hashlib.shake_256(f"{seed}/{name}/{index}".encode()).digest(min(PIECE, size - start))


def generate(out: Path, total_mib: int, shards: int, seed: str = "sparkring-bulk") -> list[dict]:
    """Write the checkpoint into `out`; returns its manifest, sorted by path."""
    out.mkdir(parents=True, exist_ok=True)
    per_shard = total_mib * 1024 * 1024 // shards
    files: dict[str, dict] = {}
    weight_map = {}
    for number in range(1, shards + 1):
        name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        tensor = f"layers.{number - 1}.weight"
        weight_map[tensor] = name
        files[name] = _write(out / name, _shard(name, tensor, per_shard, seed))
    index = {"metadata": {"total_size": per_shard * shards}, "weight_map": weight_map}
    small = {
        "model.safetensors.index.json": json.dumps(index, indent=2, sort_keys=True).encode() + b"\n",
        "config.json": json.dumps({"model_type": "sparkring-bulk", "num_shards": shards}).encode() + b"\n",
        "tokenizer.json": hashlib.shake_256(f"{seed}/tokenizer".encode()).hexdigest(96 * 1024).encode(),
    }
    for name, data in small.items():
        files[name] = _write(out / name, [data])
    return [{"path": name, **files[name]} for name in sorted(files)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--total-mib", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seed", default="sparkring-bulk")
    args = parser.parse_args()
    print(json.dumps(generate(args.out, args.total_mib, args.shards, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
