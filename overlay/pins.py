"""What the overlay would patch in an installed vLLM, measured without importing vLLM.

    python -m overlay.pins measure --wrappers 0.32.0        # inside a runtime image: one JSON line
    python -m overlay.pins measure --wheel vllm-X.whl       # a vLLM wheel file, never installed
    python -m overlay.pins reference                        # where the wrappers' vLLM is installed

``measure`` is what the ``sparkring_overlay_pins`` module runs inside a runtime image
(``docker run --rm --network none``, playbooks/overlay-pins.yml): the installed vLLM version,
the image's vLLM origin (its build record), and for every patch of the wrappers for that release
the sha256 of its upstream file and the source of its target function. With ``--wheel`` it reads
the same from a vLLM wheel (an image that installs that wheel holds exactly its files), and the
origin is the wheel's file name and sha256, as images/lock.json names it. ``reference`` writes the
target functions of the vLLM the wrappers were written against into ``overlay/upstream/``, once
per wrapper release; the pin module shows each image's functions as a diff against them.
Standard library and the SparkRing packages only: it runs with whatever Python the image has.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

from overlay import registry
from transport.integrity import sha256_file

UPSTREAM = Path(__file__).resolve().parent / "upstream"


def reference_path(wrappers: str) -> Path:
    """The stored source of the functions the wrappers for ``wrappers`` were written against."""
    return UPSTREAM / f"vllm-{wrappers}.json"


def function_source(text: str, qualname: str) -> str | None:
    """The lines of ``qualname`` (``Class.method`` or ``function``) in ``text``, decorators included."""
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.stmt | None = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    assert node is not None and node.end_lineno is not None
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno])


def measure(wrappers: str) -> dict[str, Any]:
    """The installed vLLM as the pins see it (``registry.vllm_root``, never imported)."""
    root = registry.vllm_root()
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        origin = json.loads(Path(registry.image_json_path()).read_text(encoding="utf-8")).get("vllm_origin")
    except (OSError, ValueError):
        origin = None
    targets = []
    for patch in registry.patches_for(wrappers):
        path = root / patch.file if root else None
        present = path is not None and path.is_file()
        targets.append(
            {
                "patch": patch.name,
                "file": patch.file,
                "qualname": patch.qualname,
                "sha256": sha256_file(path) if present else None,
                "source": function_source(path.read_text(encoding="utf-8"), patch.qualname)
                if present
                else None,
            }
        )
    return {"vllm_version": version, "vllm_origin": origin, "wrappers": wrappers, "targets": targets}


def wheel_version(wheel: zipfile.ZipFile) -> str | None:
    """The version in the wheel's ``vllm-*.dist-info/METADATA`` (what importlib.metadata will report)."""
    for name in wheel.namelist():
        if name.count("/") == 1 and name.endswith(".dist-info/METADATA") and name.lower().startswith("vllm-"):
            for line in wheel.read(name).decode("utf-8").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def measure_wheel(path: Path, wrappers: str) -> dict[str, Any]:
    """``measure`` for a vLLM wheel file: its files are read from the archive, nothing is installed.

    A wheel's paths are relative to site-packages, the directory that holds ``vllm``: the same
    paths the pins use."""
    with zipfile.ZipFile(path) as wheel:
        files = set(wheel.namelist())
        targets = []
        for patch in registry.patches_for(wrappers):
            data = wheel.read(patch.file) if patch.file in files else None
            targets.append(
                {
                    "patch": patch.name,
                    "file": patch.file,
                    "qualname": patch.qualname,
                    "sha256": hashlib.sha256(data).hexdigest() if data is not None else None,
                    "source": function_source(data.decode("utf-8"), patch.qualname)
                    if data is not None
                    else None,
                }
            )
        version = wheel_version(wheel)
    return {
        "vllm_version": version,
        "vllm_origin": f"{path.name}@sha256:{sha256_file(path)}",
        "wrappers": wrappers,
        "targets": targets,
    }


def reference(wrappers: str) -> dict[str, Any]:
    """The reference record for ``wrappers``, taken from the vLLM installed here (it must be that release)."""
    measured = measure(wrappers)
    found = (measured["vllm_version"] or "").split("+", 1)[0]
    if found != wrappers:
        raise SystemExit(f"vLLM {measured['vllm_version']} is installed here; the reference needs {wrappers}")
    missing = [t["patch"] for t in measured["targets"] if t["source"] is None]
    if missing:
        raise SystemExit(f"vLLM {wrappers} here lacks the targets of {missing}")
    return {
        "vllm_version": wrappers,
        "functions": {f"{t['file']}:{t['qualname']}": t["source"] for t in measured["targets"]},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m overlay.pins", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["measure", "reference"])
    parser.add_argument(
        "--wrappers", default=registry.WRAPPED_RELEASES[-1], choices=registry.WRAPPED_RELEASES
    )
    parser.add_argument("--wheel", type=Path, help="measure: a vLLM wheel file instead of the installed vLLM")
    args = parser.parse_args(argv)
    if args.command == "measure":
        measured = measure_wheel(args.wheel, args.wrappers) if args.wheel else measure(args.wrappers)
        print(json.dumps(measured, sort_keys=True))
        return 0
    if args.wheel:
        parser.error("--wheel: only measure reads a wheel")
    path = reference_path(args.wrappers)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(reference(args.wrappers), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
