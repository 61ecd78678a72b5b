"""The image lock (`images/lock.json`, docs/design.md §3.3): every input of the runtime images by content.

One schema, strict: unknown keys, short hashes and floating references are errors that name the
field. `tree_sha256` is the one definition of a source tree's hash; `stale_trees` compares the
lock with the checkout, and `python -m sparkring.lock refresh` (with `plugins/` on the path)
rewrites the tree hashes when the sources changed on purpose. `overlay_pins` are what the vLLM
overlay may patch in each runtime image; `with_overlay_pins` is the one way they get in
(playbooks/overlay-pins.yml, after a person read the diffs), never by hand.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from transport import integrity

ROOT = Path(__file__).resolve().parents[2]
LOCK_PATH = ROOT / "images" / "lock.json"
# Where a GB10 runtime image holds the patched NCCL: images/build_context.py records it in the
# image's image.json (the entrypoint and the launch attestation read it there), the launch
# preloads it, and images/Containerfile installs it there (a test keeps the two equal).
NCCL_IN_IMAGE = "/opt/sparkring/nccl/lib/libnccl.so.2"

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
GitCommit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
RepoPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")]
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]
# Files excluded from tree hashes: build outputs and caches, never sources.
TREE_EXCLUDE_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".a")
TREE_EXCLUDE_PARTS = ("__pycache__", "build", ".pytest_cache")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BaseImage(Strict):
    """A registry image pinned by manifest digest: the tag is a label, the digest is the content."""

    reference: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?$")]
    digest: Digest
    platform: Literal["linux/arm64", "linux/amd64"]

    @property
    def pinned(self) -> str:
        return f"{self.reference.split(':')[0]}@{self.digest}"


class SimBase(Strict):
    """The sim runtime's base: a debootstrapped Debian imported into Docker (no registry)."""

    suite: Name
    variant: Literal["minbase", "buildd"]
    mirror: Annotated[str, StringConstraints(pattern=r"^https?://[A-Za-z0-9._/-]+$")]
    include: list[Name]
    platform: Literal["linux/amd64", "linux/arm64"]


class Wheel(Strict):
    distribution: Name
    file: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+-]+\.whl$")]
    sha256: Sha256


class Vllm(Strict):
    """vLLM by version and content: the sim installs a hashed wheel, GB10 takes it from the base."""

    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]
    sim_wheel: Wheel
    gb10_from_base: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="the vLLM version string the pinned GB10 base image reports"
    )


class NcclPatch(Strict):
    file: RepoPath
    sha256: Sha256


class NcclRelease(Strict):
    source_url: Annotated[str, StringConstraints(pattern=r"^https://\S+$")]
    # null: the archive has not been measured yet; the NCCL build refuses such a release.
    source_sha256: Sha256 | None
    source_dir: Name
    patches: list[NcclPatch]


class Nccl(Strict):
    """Owned by the NCCL stage; this schema only guarantees its shape."""

    default_version: Name
    releases: dict[Name, NcclRelease]

    @model_validator(mode="after")
    def _default_is_a_release(self) -> Nccl:
        if self.default_version not in self.releases:
            raise ValueError(
                f"nccl.default_version {self.default_version!r} is not among releases {sorted(self.releases)}"
            )
        if self.releases[self.default_version].source_sha256 is None:
            raise ValueError(
                f"nccl.default_version {self.default_version!r} has no source_sha256: "
                "the default release must be pinned by content"
            )
        return self


class SourceTree(Strict):
    path: RepoPath
    sha256: Sha256


# A file inside a model repository, relative (hub repos keep files such as
# `original/params.json` and `.gitattributes`); "." and ".." components are refused below.
ModelPath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*$")]


class ModelFile(Strict):
    """One file of a pinned model: what every rank must hold under that name, byte for byte."""

    path: ModelPath
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256

    @field_validator("path")
    @classmethod
    def _inside(cls, value: str) -> str:
        if any(part in (".", "..") for part in value.split("/")):
            raise ValueError("a model file path stays inside the model directory (no '.' or '..')")
        return value


class Model(Strict):
    """A model or draft, pinned by content: a hub repository at an exact commit, or generated
    here (the sim's tiny model) under a label; either way the manifest of every file."""

    role: Literal["target", "draft"]
    source: Literal["generated", "hub"]
    generator: RepoPath | None = None
    repository: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")] | None = None
    # hub: the 40-hex commit; generated: the generator's label (the profile's MODEL_REVISION).
    revision: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")]
    files: Annotated[list[ModelFile], Field(min_length=1)]

    @model_validator(mode="after")
    def _source_fields(self) -> Model:
        if self.source == "generated" and (self.generator is None or self.repository):
            raise ValueError("a generated model names its generator and no repository")
        if self.source == "hub" and (self.repository is None or self.generator):
            raise ValueError("a hub model names its repository and no generator")
        if self.source == "hub" and not re.fullmatch(r"[0-9a-f]{40}", self.revision):
            raise ValueError(
                f"revision {self.revision!r}: a hub model is pinned by its exact 40-hex commit, "
                "never a branch or tag"
            )
        paths = [file.path for file in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError(f"files: a path is listed twice in {sorted(paths)}")
        return self


Flavor = Literal["gb10", "sim"]
Release = Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]


class OverlayPins(Strict):
    """What the overlay may patch in one runtime image's vLLM, as measured in that image.

    A runtime image carries the lock, so it cannot be named by its own ID: the pins name what gave
    it its vLLM (`Lock.vllm_origin`), and count only while the lock still pins that origin."""

    image: Annotated[str, StringConstraints(min_length=1)]
    vllm_version: Annotated[str, StringConstraints(min_length=1)]
    wrappers: Release = Field(description="the vLLM release the overlay's wrappers were written against")
    files: dict[RepoPath, Sha256] = Field(min_length=1)


class Lock(Strict):
    version: Literal[1]
    base_images: dict[Name, BaseImage]
    sim_base: SimBase
    vllm: Vllm
    nccl: Nccl | None = None
    source_trees: dict[Name, SourceTree]
    models: dict[Name, Model]
    overlay_pins: dict[Flavor, OverlayPins] = {}

    def vllm_origin(self, flavor: Flavor) -> str:
        """What gives a runtime image of `flavor` its vLLM: the GB10 base by digest, the sim's wheel."""
        if flavor == "gb10":
            return self.base_images["gb10"].pinned
        return f"{self.vllm.sim_wheel.file}@sha256:{self.vllm.sim_wheel.sha256}"

    def vllm_version_in(self, flavor: Flavor) -> str:
        """The version importlib.metadata reports for vLLM in a runtime image of `flavor`."""
        return self.vllm.gb10_from_base if flavor == "gb10" else f"{self.vllm.version}+cpu"

    def overlay_pins_for(self, flavor: Flavor) -> OverlayPins | None:
        """The pins of the image the lock builds now for `flavor` (stale pins of an old origin: None)."""
        pins = self.overlay_pins.get(flavor)
        return pins if pins is not None and pins.image == self.vllm_origin(flavor) else None

    def unpinned_reason(self, flavor: Flavor) -> str:
        """Why `flavor` has no pins, in the user's terms: the image, its vLLM and where pins would go."""
        stale = self.overlay_pins.get(flavor)
        found = f" (it holds pins for {stale.image}, which it no longer builds from)" if stale else ""
        return (
            f"images/lock.json has no overlay pins for the {flavor} runtime image "
            f"({self.vllm_origin(flavor)}, vLLM {self.vllm_version_in(flavor)}){found}"
        )


def load_lock(path: Path = LOCK_PATH) -> Lock:
    """Parse and validate; pydantic's error names the field path and the expected shape."""
    return Lock.model_validate_json(path.read_text(encoding="utf-8"))


def tree_files(root: Path, path: str) -> list[str]:
    """Files a commit of `path` would hold: git's view when there is one, else a walk."""
    top = root / path
    try:
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
                "--",
                path,
            ],
            capture_output=True,
            check=True,
        ).stdout.decode()
        names = [name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(root)) for p in top.rglob("*") if p.is_file()]
    keep = []
    for name in names:
        parts = Path(name).parts
        if name.endswith(TREE_EXCLUDE_SUFFIXES) or any(part in TREE_EXCLUDE_PARTS for part in parts):
            continue
        if any(part.endswith(".egg-info") for part in parts) or not (root / name).is_file():
            continue
        keep.append(name)
    return sorted(set(keep))


def tree_sha256(path: str, root: Path = ROOT) -> str:
    """sha256 over `relative-path NUL file-sha256 LF` lines, sorted: names and contents, no mtimes."""
    return integrity.tree_sha256(
        root / path, [str(Path(name).relative_to(path)) for name in tree_files(root, path)]
    )


def stale_trees(lock: Lock, root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Trees whose checkout no longer matches the lock: name -> (locked, actual)."""
    stale = {}
    for name, tree in lock.source_trees.items():
        actual = tree_sha256(tree.path, root)
        if actual != tree.sha256:
            stale[name] = (tree.sha256, actual)
    return stale


def refresh(path: Path = LOCK_PATH, root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Rewrite the tree hashes in place (only those); returns what changed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    lock = Lock.model_validate(data)
    changed = stale_trees(lock, root)
    for name, (_old, new) in changed.items():
        data["source_trees"][name]["sha256"] = new
    if changed:
        Lock.model_validate(data)
        integrity.write_json_atomic(path, data, indent=2, sort_keys=False)
    return changed


def with_overlay_pins(text: str, flavor: Flavor, pins: dict) -> str:
    """The lock `text` with `pins` (the pin module's measurement) as `overlay_pins[flavor]`.

    Refuses pins measured in an image the lock no longer builds, so a stale image on rank 0 can
    never pin the next one. The result is validated and formatted as `refresh` writes the lock;
    pins that are already there leave `text` as it is."""
    data = json.loads(text)
    lock = Lock.model_validate(data)
    entry = OverlayPins.model_validate(pins)
    if entry.image != lock.vllm_origin(flavor):
        raise ValueError(
            f"overlay_pins.{flavor}: the image measured carries vLLM from {entry.image}, but the lock builds "
            f"the {flavor} image from {lock.vllm_origin(flavor)}; run the image stage (playbooks/image.yml) "
            "and pin again"
        )
    if entry.vllm_version != lock.vllm_version_in(flavor):
        raise ValueError(
            f"overlay_pins.{flavor}: the image reports vLLM {entry.vllm_version}, the lock says "
            f"{lock.vllm_version_in(flavor)}; correct the lock's vllm section first"
        )
    if data.get("overlay_pins", {}).get(flavor) == entry.model_dump():
        return text  # already pinned: the file stays as it is, byte for byte
    data["overlay_pins"] = {**data.get("overlay_pins", {}), flavor: entry.model_dump()}
    Lock.model_validate(data)
    return json.dumps(data, indent=2) + "\n"


def main(argv: list[str]) -> int:
    """`show` prints the validated lock; `check` lists stale trees (exit 1 if any); `refresh` rewrites them."""
    if argv not in (["show"], ["check"], ["refresh"]):
        print("usage: python -m sparkring.lock show|check|refresh", file=sys.stderr)
        return 2
    if argv == ["show"]:
        print(load_lock().model_dump_json())
        return 0
    if argv == ["refresh"]:
        for name, (old, new) in refresh().items():
            print(f"{name}: {old[:12]} -> {new[:12]}")
        return 0
    stale = stale_trees(load_lock())
    for name, (old, new) in stale.items():
        print(f"{name}: locked {old[:12]}, checkout {new[:12]}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
