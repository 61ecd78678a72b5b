"""The image lock (`images/lock.json`, docs/design.md §3.3): every input of the runtime images by content.

One schema, strict: unknown keys, short hashes and floating references are errors that name the
field. `tree_sha256` is the one definition of a source tree's hash; `stale_trees` compares the
lock with the checkout, and `python -m sparkring.lock refresh` (with `plugins/` on the path)
rewrites the tree hashes when the sources changed on purpose. `overlay_pins` are what the vLLM
overlay may patch in each runtime image; `with_overlay_pins` is the one way they get in
(playbooks/overlay-pins.yml, after a person read the diffs), never by hand. `wheels` are the
wheel sets a runtime image installs with `--require-hashes`; `with_wheels` is the one way a
resolved set gets in (playbooks/wheel-lock.yml).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from sparkring.module_utils import load_module_utils
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
# A model's file paths and hub commit, as the pin command checks them on the node.
MODEL_NAMES = load_module_utils("sparkring_model_names")
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


class DebootstrapBase(Strict):
    """A runtime's base made by debootstrap from these inputs and imported into Docker (no registry):
    the sim's (amd64, on the controller) and the upstream GB10 flavor's (arm64, on rank 0)."""

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
    """vLLM by version and content: the sim installs a hashed wheel, the upstream flavor the
    `wheels.upstream` one, the fork flavor takes it from its base image."""

    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]
    sim_wheel: Wheel
    fork_from_base: Annotated[str, StringConstraints(min_length=1)] = Field(
        description="the vLLM version string the pinned fork base image reports"
    )


# A requirement as pip reads it: a project, optional extras, optional version specifiers.
Requirement = Annotated[
    str,
    StringConstraints(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?"
        r"((===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!-]+(,(===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!-]+)*)?$"
    ),
]
# The newest manylinux tag a runtime's base runs (its glibc); older ones are accepted too.
PipPlatform = Annotated[str, StringConstraints(pattern=r"^manylinux_2_[0-9]+_(aarch64|x86_64)$")]


def canonical_name(name: str) -> str:
    """A project name as pip compares them (PEP 503): `Foo_Bar.baz` is `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


class LockedWheel(Strict):
    """One wheel of a runtime's set: what pip may install, by name, version, file and content."""

    name: Name
    version: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")]
    file: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.+!-]+\.whl$")]
    sha256: Sha256


class WheelSet(Strict):
    """Every wheel a runtime image installs, for one platform and Python, each by sha256.

    `complete` is true only where pip resolved `requirements` into exactly `wheels`
    (playbooks/wheel-lock.yml writes it); a set measured by hand is incomplete, and an image
    build refuses it."""

    platform: PipPlatform
    python_version: Annotated[str, StringConstraints(pattern=r"^3\.[0-9]+$")]
    requirements: Annotated[list[Requirement], Field(min_length=1)]
    complete: bool
    wheels: Annotated[list[LockedWheel], Field(min_length=1)]

    @model_validator(mode="after")
    def _one_wheel_per_project(self) -> WheelSet:
        names = [canonical_name(wheel.name) for wheel in self.wheels]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"wheels: {twice} listed twice (one wheel per project)")
        return self

    def wheel(self, name: str) -> LockedWheel | None:
        """The locked wheel of project `name` (any spelling), if the set holds it."""
        return next((w for w in self.wheels if canonical_name(w.name) == canonical_name(name)), None)

    def hashed_requirements(self) -> str:
        """The set as a requirements file for `pip install --require-hashes --no-index`: exact versions, one hash each."""
        return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in self.wheels)

    def wheelhouse_problems(self, directory: Path) -> list[str]:
        """Why the wheelhouse `directory` is not exactly this set: an unpinned wheel, a swapped one
        (the locked name, other content) or a missing one, each named. Empty: build from it."""
        by_file = {w.file: w for w in self.wheels}
        present = {p.name: p for p in sorted(directory.iterdir())} if directory.is_dir() else {}
        problems = []
        for name, path in present.items():
            wheel = by_file.get(name)
            if wheel is None:
                problems.append(f"{path}: unpinned, not in the lock's wheel set; remove it")
            elif (actual := integrity.sha256_file(path)) != wheel.sha256:
                problems.append(f"{path}: swapped, sha256 {actual}, the lock pins {wheel.sha256}; remove it")
        problems += [
            f"{directory}/{w.file}: missing (the lock pins it)" for w in self.wheels if w.file not in present
        ]
        return problems


class NcclPatch(Strict):
    file: RepoPath
    sha256: Sha256


class NcclRelease(Strict):
    source_url: Annotated[str, StringConstraints(pattern=r"^https://\S+$")]
    # null: the archive has not been measured yet; the NCCL build refuses such a release unless
    # source_tree_sha256 pins it.
    source_sha256: Sha256 | None
    # The unpacked tree's digest (module_utils/sparkring_nccl.py source_tree_digest): pins a source
    # whose archive bytes depend on who packed it (GitHub's archives of a commit).
    source_tree_sha256: Sha256 | None = None
    source_dir: Name
    patches: list[NcclPatch]

    @property
    def pinned(self) -> bool:
        """Pinned by content: its archive's bytes or its unpacked tree."""
        return self.source_sha256 is not None or self.source_tree_sha256 is not None


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
        if not self.releases[self.default_version].pinned:
            raise ValueError(
                f"nccl.default_version {self.default_version!r} has no source_sha256 or source_tree_sha256: "
                "the default release must be pinned by content"
            )
        return self


class SourceTree(Strict):
    path: RepoPath
    sha256: Sha256


class ModelFile(Strict):
    """One file of a pinned model: what every rank must hold under that name, byte for byte.

    `path` is relative (hub repos keep files such as `original/params.json` and `.gitattributes`),
    UTF-8 in Unicode NFC; the rule is module_utils/sparkring_model_names.py, which the pin command
    applies on the node before it hashes a byte."""

    path: str
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256

    @field_validator("path")
    @classmethod
    def _pinnable(cls, value: str) -> str:
        problem = MODEL_NAMES.file_name_problem(value)
        if problem:
            raise ValueError(problem)
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
        problem = MODEL_NAMES.hub_commit_problem(self.revision) if self.source == "hub" else None
        if problem:
            raise ValueError(problem)
        paths = [file.path for file in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError(f"files: a path is listed twice in {sorted(paths)}")
        return self


# The runtime flavors (images/build_context.py --flavor, the inventory's image_flavor): two on
# GB10 (upstream vLLM on a debootstrapped base, or the community fork's base image), one on the sim.
Flavor = Literal["upstream", "fork", "sim"]
FLAVORS: tuple[Flavor, ...] = get_args(Flavor)
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
    sim_base: DebootstrapBase
    upstream_base: DebootstrapBase
    vllm: Vllm
    nccl: Nccl | None = None
    source_trees: dict[Name, SourceTree]
    models: dict[Name, Model]
    wheels: dict[Flavor, WheelSet]
    overlay_pins: dict[Flavor, OverlayPins] = {}

    @model_validator(mode="after")
    def _upstream_runs_the_locked_vllm(self) -> Lock:
        upstream = self.wheels.get("upstream")
        wheel = upstream.wheel("vllm") if upstream else None
        if wheel is None or wheel.version != self.vllm.version:
            raise ValueError(
                f"wheels.upstream: must hold the vllm {self.vllm.version} wheel (vllm.version), "
                f"holds {wheel.version if wheel else 'none'}"
            )
        return self

    def vllm_origin(self, flavor: Flavor) -> str:
        """What gives a runtime image of `flavor` its vLLM: a wheel by sha256, or the fork's base by digest."""
        if flavor == "fork":
            return self.base_images["fork"].pinned
        wheel = self.vllm.sim_wheel if flavor == "sim" else self.wheels["upstream"].wheel("vllm")
        assert wheel is not None  # the validator above
        return f"{wheel.file}@sha256:{wheel.sha256}"

    def vllm_version_in(self, flavor: Flavor) -> str:
        """The version importlib.metadata reports for vLLM in a runtime image of `flavor`."""
        if flavor == "fork":
            return self.vllm.fork_from_base
        return f"{self.vllm.version}+cpu" if flavor == "sim" else self.vllm.version

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


def with_model(text: str, name: str, model: dict) -> str:
    """The lock `text` with `model` (the pin command's measurement) as `models[name]`.

    The one way a model's manifest gets in (playbooks/model-pin.yml writes the result with
    `ansible.builtin.copy`, so `--check --diff` shows it first): validated as the lock's schema, an
    entry of that name replaced, the rest kept; a pin already there leaves `text` as it is."""
    data = json.loads(text)
    Lock.model_validate(data)
    pinned = Model.model_validate(model).model_dump(exclude_none=True)
    if data["models"].get(name) == pinned:
        return text  # already pinned: the file stays as it is, byte for byte
    data["models"] = {**data["models"], name: pinned}
    Lock.model_validate(data)
    return json.dumps(data, indent=2) + "\n"


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


def with_wheels(text: str, flavor: Flavor, wheel_set: dict) -> str:
    """The lock `text` with `wheel_set` (the wheel-lock module's resolution) as `wheels[flavor]`.

    The result is validated (a set without the locked vLLM is refused, naming the field; so is a
    swapped wheel: a file the lock pins, resolved with another sha256) and formatted as
    `with_overlay_pins` writes the lock; a set already there leaves `text` as it is."""
    data = json.loads(text)
    locked = Lock.model_validate(data).wheels.get(flavor)
    entry = WheelSet.model_validate(wheel_set)
    pinned = {w.file: w.sha256 for w in locked.wheels} if locked else {}
    for wheel in entry.wheels:
        if pinned.get(wheel.file, wheel.sha256) != wheel.sha256:
            raise ValueError(
                f"wheels.{flavor}: {wheel.file} resolves with sha256 {wheel.sha256}, but the lock pins it with "
                f"{pinned[wheel.file]}; a published wheel never changes: check the index the resolution used"
            )
    if data.get("wheels", {}).get(flavor) == entry.model_dump():
        return text  # already locked: the file stays as it is, byte for byte
    data["wheels"] = {**data.get("wheels", {}), flavor: entry.model_dump()}
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
