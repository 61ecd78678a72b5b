"""Assemble a runtime image's build context from the checkout, bound to images/lock.json.

    .venv/bin/python images/build_context.py --flavor sim|gb10 --out DIR [--nccl-lib PATH] [--dry-run]

Refuses (exit 1, naming the tree and the fix) when the lock's source-tree hashes do not match
the checkout: an image is built only from the sources the lock names. Writes DIR/src (the
packages, exactly the files the tree hashes cover), DIR/lock.json, DIR/entrypoint.py,
DIR/Containerfile, DIR/image.json (what the entrypoint attests, with the vLLM origin and the lock's
overlay pins for it, which the overlay checks at start) and, for sim, vllm_alias.py.
DIR/wheels (sim) is the wheelhouse the image role downloads and is left as it is; its wheels
count towards the inputs. Prints one JSON line: {"inputs_sha256", "tag", "changed"}; the tag
is derived from the inputs, so an unchanged context names an image that already exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from sparkring.lock import LOCK_PATH, NCCL_IN_IMAGE, load_lock, stale_trees, tree_files

from transport.integrity import sha256_file

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("transport", "overlay", "sparkcache")
FILES_ROOT = "/opt/sparkring/src"
INTEGRITY = "sparkring_integrity.py"


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True


def planned_files(flavor: str, nccl_lib: Path | None) -> tuple[dict[str, bytes], dict]:
    """Every file of the context but the wheelhouse, as bytes, plus the image record."""
    lock = load_lock()
    stale = stale_trees(lock)
    if stale:
        raise SystemExit(
            f"images/lock.json does not match the checkout for {sorted(stale)}; refusing to build. "
            "Refresh it (.venv/bin/python -m sparkring.lock refresh) if the change is intended."
        )
    names = {"pyproject.toml"} | {name for pkg in PACKAGES for name in tree_files(ROOT, pkg)}
    planned = {f"src/{name}": (ROOT / name).read_bytes() for name in sorted(names)}
    containerfile = ROOT / "images" / ("sim/Containerfile" if flavor == "sim" else "Containerfile")
    planned["Containerfile"] = containerfile.read_bytes()
    planned["entrypoint.py"] = (ROOT / "images" / "entrypoint.py").read_bytes()
    # The entrypoint and the launch's in-image probe hash with the image's own copy of it.
    planned[INTEGRITY] = (ROOT / "module_utils" / INTEGRITY).read_bytes()
    planned["lock.json"] = LOCK_PATH.read_bytes()
    nccl = None
    if flavor == "sim":
        planned["vllm_alias.py"] = (ROOT / "images" / "sim-model" / "vllm_alias.py").read_bytes()
        vllm_version = f"{lock.vllm.version}+cpu"
    else:
        if nccl_lib is None or not nccl_lib.is_file():
            raise SystemExit(
                f"--nccl-lib {nccl_lib}: the patched libnccl.so.2 from the build stage is required"
            )
        planned["nccl/libnccl.so.2"] = nccl_lib.read_bytes()
        nccl = {"path": NCCL_IN_IMAGE, "sha256": hashlib.sha256(planned["nccl/libnccl.so.2"]).hexdigest()}
        vllm_version = lock.vllm.gb10_from_base
    image = {
        "flavor": flavor,
        "lock_sha256": hashlib.sha256(planned["lock.json"]).hexdigest(),
        "sources_sha256": {name: tree.sha256 for name, tree in lock.source_trees.items()},
        "vllm_version": vllm_version,
        "files_root": FILES_ROOT,
        "files": {
            name[len("src/") :]: hashlib.sha256(planned[name]).hexdigest()
            for name in planned
            if name.startswith("src/")
        },
        "nccl": nccl,
        # What gave the image its vLLM, and the lock's overlay pins for it (None: not pinned yet);
        # the overlay reads them at start (overlay/registry.py), the pin module reads the origin.
        "vllm_origin": lock.vllm_origin(flavor),
        "overlay_pins": pins.model_dump() if (pins := lock.overlay_pins_for(flavor)) else None,
    }
    planned["image.json"] = (json.dumps(image, indent=1, sort_keys=True) + "\n").encode()
    return planned, image


def assemble(flavor: str, out: Path, nccl_lib: Path | None, dry_run: bool = False) -> dict:
    """Write the context (unless dry_run) and name it by the sha256 of all its inputs."""
    planned, _image = planned_files(flavor, nccl_lib)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in planned.items()}
    wheels = out / "wheels"
    if wheels.is_dir():
        digests.update({f"wheels/{p.name}": sha256_file(p) for p in wheels.iterdir() if p.is_file()})
    inputs = hashlib.sha256(
        "".join(f"{name}\0{digests[name]}\n" for name in sorted(digests)).encode()
    ).hexdigest()
    changed = False
    if not dry_run:
        for name, data in planned.items():
            changed |= write_if_changed(out / name, data)
        for stray in sorted(p for p in out.rglob("*") if p.is_file()):
            relative = str(stray.relative_to(out))
            if not relative.startswith("wheels/") and relative not in planned:
                stray.unlink()
                changed = True
    return {"inputs_sha256": inputs, "tag": f"sparkring/runtime:{flavor}-{inputs[:16]}", "changed": changed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", choices=["sim", "gb10"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nccl-lib", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="name the context, write nothing")
    args = parser.parse_args()
    if args.flavor == "sim" and not (args.out / "wheels").is_dir():
        raise SystemExit(f"{args.out}/wheels: the wheelhouse is missing; the image role downloads it first")
    if not args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
    result = assemble(args.flavor, args.out, args.nccl_lib, args.dry_run)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
