"""Assemble a runtime image's build context from the checkout, bound to images/lock.json.

    .venv/bin/python images/build_context.py --flavor upstream|fork|sim --out DIR [--nccl-lib PATH] [--dry-run]

Refuses (exit 1, naming the tree and the fix) when the lock's source-tree hashes do not match
the checkout: an image is built only from the sources the lock names. Writes DIR/src (the
packages, exactly the files the tree hashes cover), DIR/lock.json, DIR/entrypoint.py,
DIR/Containerfile, DIR/image.json (what the entrypoint attests, with the vLLM origin and the lock's
overlay pins for it, which the overlay checks at start) and, for sim, vllm_alias.py and a
requirements.txt naming vLLM at the lock's version.
DIR/wheels is the wheelhouse and counts towards the inputs: the sim's is downloaded by the image
role and left as it is. A flavor with a wheel set in the lock (upstream) gets DIR/requirements.txt
(every wheel by version and sha256, for `pip install --require-hashes --no-index`) and its locked
wheels downloaded into DIR/wheels by exact hash where missing; the build refuses (naming the
wheel) a set the lock does not hold complete, and a wheelhouse with an unpinned, swapped or
missing wheel. Prints one JSON line: {"inputs_sha256", "tag", "changed"}; the tag
is derived from the inputs, so an unchanged context names an image that already exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from sparkring.lock import FLAVORS, LOCK_PATH, NCCL_IN_IMAGE, WheelSet, load_lock, stale_trees, tree_files
from sparkring.module_utils import load_module_utils

from transport.integrity import sha256_file

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("transport", "overlay", "sparkcache")
FILES_ROOT = "/opt/sparkring/src"
INTEGRITY = "sparkring_integrity.py"
# Each flavor's Containerfile, under images/.
CONTAINERFILES = {"upstream": "upstream/Containerfile", "fork": "Containerfile", "sim": "sim/Containerfile"}


def incomplete_refusal(flavor: str, wheel_set: WheelSet) -> str:
    """Why a wheel set that pip did not resolve whole cannot build an image, and how to resolve it."""
    held = ", ".join(f"{w.name} {w.version}" for w in wheel_set.wheels)
    return (
        f"images/lock.json wheels.{flavor} is not complete (it holds {held}, not everything "
        f"{', '.join(wheel_set.requirements)} install); resolve the whole set on rank 0 and write it into the "
        "lock: ansible-playbook -i inventories/<cluster> playbooks/wheel-lock.yml --check --diff, then without "
        "--check (docs/image.md)"
    )


def fetch_wheels(wheel_set: WheelSet, wheels: Path) -> None:
    """Download the locked wheels the wheelhouse lacks, each by its exact version and sha256."""
    missing = [w for w in wheel_set.wheels if not (wheels / w.file).is_file()]
    if not missing:
        return
    requirements = wheels.parent / "requirements-missing.txt"
    requirements.write_text(wheel_set.model_copy(update={"wheels": missing}).hashed_requirements())
    tags = load_module_utils("sparkring_wheels").platform_tags(wheel_set.platform)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
    argv += ["--only-binary=:all:", "--python-version", wheel_set.python_version]
    argv += [arg for tag in tags for arg in ("--platform", tag)]
    try:
        subprocess.run([*argv, "-r", str(requirements), "-d", str(wheels)], check=True)
    except subprocess.CalledProcessError as error:
        raise SystemExit(
            f"downloading {[w.file for w in missing]} into {wheels} failed (exit {error.returncode})"
        ) from None
    finally:
        requirements.unlink()


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
    containerfile = ROOT / "images" / CONTAINERFILES[flavor]
    planned["Containerfile"] = containerfile.read_bytes()
    planned["entrypoint.py"] = (ROOT / "images" / "entrypoint.py").read_bytes()
    # The entrypoint and the launch's in-image probe hash with the image's own copy of it.
    planned[INTEGRITY] = (ROOT / "module_utils" / INTEGRITY).read_bytes()
    planned["lock.json"] = LOCK_PATH.read_bytes()
    nccl = None
    wheel_set = lock.wheels.get(flavor)
    if wheel_set is not None:
        if not wheel_set.complete:
            raise SystemExit(incomplete_refusal(flavor, wheel_set))
        planned["requirements.txt"] = wheel_set.hashed_requirements().encode()
    if flavor == "sim":
        # The one vLLM version (the lock's) the sim Containerfile installs from the wheelhouse.
        planned["requirements.txt"] = f"{lock.vllm.sim_wheel.distribution}=={lock.vllm.version}\n".encode()
        planned["vllm_alias.py"] = (ROOT / "images" / "sim-model" / "vllm_alias.py").read_bytes()
    else:
        if nccl_lib is None or not nccl_lib.is_file():
            raise SystemExit(
                f"--nccl-lib {nccl_lib}: the patched libnccl.so.2 from the build stage is required"
            )
        planned["nccl/libnccl.so.2"] = nccl_lib.read_bytes()
        nccl = {"path": NCCL_IN_IMAGE, "sha256": hashlib.sha256(planned["nccl/libnccl.so.2"]).hexdigest()}
    image = {
        "flavor": flavor,
        "lock_sha256": hashlib.sha256(planned["lock.json"]).hexdigest(),
        "sources_sha256": {name: tree.sha256 for name, tree in lock.source_trees.items()},
        "vllm_version": lock.vllm_version_in(flavor),
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
    wheel_set = load_lock().wheels.get(flavor)
    if wheel_set is not None:
        if not dry_run:
            wheels.mkdir(parents=True, exist_ok=True)
            fetch_wheels(wheel_set, wheels)
        problems = wheel_set.wheelhouse_problems(wheels) if wheels.is_dir() else []
        if problems:
            raise SystemExit(
                f"refusing to build the {flavor} image from a wheelhouse that is not the lock's wheels.{flavor}:\n"
                + "\n".join(problems)
            )
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
    parser.add_argument("--flavor", choices=FLAVORS, required=True)
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
