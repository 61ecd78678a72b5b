"""Patched NCCL from a pinned source: verify, preimage-check, patch, build, attest.

Shared by the `sparkring_nccl_build` module (on the node), the tests and the device lane, so
the one build recipe is the one that is tested. Standard library only: it travels to the node.

Why preimages: a patch that applies with fuzz to a slightly different NCCL can compile and
still be wrong. Each patch file names the sha256 of every file it touches as it must be just
before the patch (`Preimage-SHA256: <hex>  <path>` lines above the diff); anything else is
refused, and `patch --fuzz=0` applies the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from ansible.module_utils.sparkring_integrity import (
        package_files,
        sha256_file,
        tree_sha256,
        write_json_atomic,
    )
except ImportError:  # loaded by path where Ansible is absent (the device lane, images/nccl/fetch_source.py)
    from sparkring_integrity import package_files, sha256_file, tree_sha256, write_json_atomic

ATTESTATION_SCHEMA = 1
LIBRARY = "lib/libnccl.so.2"
ATTESTATION = "attestation.json"
DEFAULT_GENCODE = "-gencode=arch=compute_121,code=sm_121"
MAKE_TARGET = "src.build"
# nvcc leaves its temporary file names (they carry a pid) in the symbol table: stripped, two
# builds of the same inputs are byte-identical, so every rank can attest the same sha256.
STRIP = ["strip", "--strip-all"]
# A full build takes minutes: make writes to BUILD_LOG and, this often, PROGRESS (under the work
# dir) names the minutes so far and the log's last line (the nccl role shows it per rank).
BUILD_LOG = "build.log"
PROGRESS = "progress.json"
PROGRESS_INTERVAL_S = 10.0
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PREIMAGE_RE = re.compile(r"^Preimage-SHA256: ([0-9a-f]{64})  (\S+)$")
TOUCHED_RE = re.compile(r"^\+\+\+ b/(\S+)", re.M)

# run(argv, cwd, env) -> (rc, stdout, stderr): the module passes AnsibleModule.run_command.
Runner = Callable[[list[str], str, dict[str, str]], tuple[int, str, str]]


class NcclBuildError(Exception):
    """A refusal: `field` names the input that failed, the message says what to do."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class PatchSpec:
    path: str
    sha256: str


@dataclass(frozen=True)
class ParsedPatch:
    preimages: dict[str, str]
    touched: list[str]


@dataclass
class BuildRequest:
    """Every input of one build; `identity()` hashes those that shape the output."""

    version: str
    source_archive: str
    source_sha256: str | None
    source_dir: str
    patches: list[PatchSpec]
    dest: str
    work_dir: str
    nvcc_gencode: str = DEFAULT_GENCODE
    only_funcs: str = ""
    cuda_home: str = "/usr/local/cuda"
    jobs: int = 0
    compilers: dict[str, str] = field(default_factory=dict)
    # The digest of the unpacked tree (source_tree_digest): pins a source whose archive bytes
    # depend on who packed it (GitHub's archives), where source_sha256 pins the bytes.
    source_tree_sha256: str | None = None

    def inputs(self) -> dict:
        # A release pinned by its bytes alone keeps the identity it had before tree pins existed.
        tree = {"source_tree_sha256": self.source_tree_sha256} if self.source_tree_sha256 else {}
        return {
            "version": self.version,
            "source_sha256": self.source_sha256,
            **tree,
            "source_dir": self.source_dir,
            "patches": [p.sha256 for p in self.patches],  # by content: where a node keeps them is no input
            "compilers": self.compilers,
            "flags": {
                # NCCL embeds its build paths: the same work_dir on every rank, the same bytes.
                "work_dir": self.work_dir,
                "make_target": MAKE_TARGET,
                "strip": " ".join(STRIP),
                "NVCC_GENCODE": self.nvcc_gencode,
                "ONLY_FUNCS": self.only_funcs,
            },
        }

    def identity(self) -> str:
        return sha256_bytes(json.dumps(self.inputs(), sort_keys=True).encode())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_patch(text: str, name: str) -> ParsedPatch:
    """Preimage lines and touched files; a touched file without a preimage is refused."""
    preimages: dict[str, str] = {}
    for line in text.split("\n--- ", 1)[0].splitlines():
        match = PREIMAGE_RE.match(line)
        if match:
            preimages[match.group(2)] = match.group(1)
    touched = TOUCHED_RE.findall(text)
    if not touched:
        raise NcclBuildError("patches", f"{name} touches no file (no '+++ b/...' line): not a patch")
    missing = sorted(set(touched) - set(preimages))
    extra = sorted(set(preimages) - set(touched))
    if missing or extra:
        raise NcclBuildError(
            "patches",
            f"{name}: Preimage-SHA256 lines must cover exactly the files it touches "
            f"(without a preimage: {missing}; preimage for an untouched file: {extra})",
        )
    return ParsedPatch(preimages, touched)


def check_pins(request: BuildRequest) -> None:
    """The archive (when pinned by its bytes) and every patch are the pinned bytes; refuse a
    release pinned neither by its archive nor by its tree (the tree is checked as it is
    unpacked: unpack_pinned)."""
    if not request.source_sha256 and not request.source_tree_sha256:
        raise NcclBuildError(
            "source_sha256",
            f"NCCL {request.version} has no pinned source sha256 (images/lock.json "
            f"nccl.releases.{request.version}.source_sha256 for the archive's bytes, or "
            "source_tree_sha256 for its unpacked tree): measure the source on a machine that "
            "can download it and pin it before building",
        )
    for name, value in (
        ("source_sha256", request.source_sha256),
        ("source_tree_sha256", request.source_tree_sha256),
    ):
        if value and not SHA256_RE.match(value):
            raise NcclBuildError(name, f"{value!r} is not a 64-hex sha256")
    if not os.path.isfile(request.source_archive):
        raise NcclBuildError(
            "source_archive", f"{request.source_archive} does not exist: fetch the source first"
        )
    if request.source_sha256 and (actual := sha256_file(request.source_archive)) != request.source_sha256:
        raise NcclBuildError(
            "source_sha256",
            f"{request.source_archive} has sha256 {actual}, the lock pins {request.source_sha256}: "
            "this is not the pinned NCCL source; delete it and fetch again",
        )
    for patch in request.patches:
        if not os.path.isfile(patch.path):
            raise NcclBuildError("patches", f"patch {patch.path} does not exist")
        actual = sha256_file(patch.path)
        if actual != patch.sha256:
            raise NcclBuildError(
                "patches",
                f"patch {patch.path} has sha256 {actual}, the lock pins {patch.sha256}: "
                "restore the committed patch or re-pin it in images/lock.json",
            )


def extract_source(archive: str, source_dir: str, into: Path) -> Path:
    """Unpack into `into` and return the source tree; every member must stay under `source_dir`.

    Checked by hand because the nodes' Python (3.11.2 on Debian 12) has no tarfile filters.
    """
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            unsafe = (
                member.name.startswith("/")
                or ".." in parts
                or not (member.isfile() or member.isdir() or member.issym())
            )
            if member.issym():
                target = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
                unsafe = unsafe or member.linkname.startswith("/") or not target.startswith(source_dir + "/")
            if unsafe:
                raise NcclBuildError(
                    "source_archive",
                    f"{archive}: refusing member {member.name!r} (absolute, '..', link or device)",
                )
            if not parts or parts[0] != source_dir:
                raise NcclBuildError(
                    "source_dir",
                    f"{archive} holds {member.name!r} outside {source_dir!r}, the lock's source_dir",
                )
        # Every member was checked above; newer Pythons also get their own `data` filter.
        tar.extractall(
            into, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {})
        )
    return into / source_dir


def source_tree_digest(tree: Path) -> str:
    """The unpacked source's digest: sorted file names and contents (sparkring_integrity.tree_sha256),
    so it is the same however the archive was packed (compression, member order, owners, times)."""
    return tree_sha256(tree, package_files(tree))


def unpack_pinned(request: BuildRequest, into: Path) -> Path:
    """extract_source, then the tree pin (source_tree_sha256) when the release has one."""
    tree = extract_source(request.source_archive, request.source_dir, into)
    if request.source_tree_sha256:
        actual = source_tree_digest(tree)
        if actual != request.source_tree_sha256:
            raise NcclBuildError(
                "source_tree_sha256",
                f"{request.source_archive} unpacks to a tree with digest {actual}, the lock pins "
                f"{request.source_tree_sha256}: this is not the pinned NCCL source; delete it and fetch again",
            )
    return tree


def apply_patches(tree: Path, patches: list[PatchSpec], run: Runner) -> list[dict]:
    """Check each patch's preimages on the tree as it stands, then apply it with no fuzz."""
    applied = []
    for patch in patches:
        name = os.path.basename(patch.path)
        with open(patch.path, encoding="utf-8") as handle:
            parsed = parse_patch(handle.read(), name)
        for rel, expected in parsed.preimages.items():
            target = tree / rel
            actual = sha256_file(target) if target.is_file() else "absent"
            if actual != expected:
                raise NcclBuildError(
                    "preimage",
                    f"{name}: {rel} has sha256 {actual}, the patch was written for {expected}: "
                    "the source is not the one this patch expects; refusing to patch",
                )
        argv = ["patch", "-p1", "--fuzz=0", "--forward", "--batch", "-d", str(tree), "-i", patch.path]
        rc, out, err = run(argv, str(tree), {})
        if rc != 0:
            raise NcclBuildError(
                "patches", f"{name} did not apply with --fuzz=0: {(out + err).strip()[-2000:]}"
            )
        applied.append({"file": name, "sha256": patch.sha256, "preimages": parsed.preimages})
    return applied


def compiler_versions(cuda_home: str, run: Runner) -> dict[str, str]:
    """The first line that names each compiler's release: part of the build identity."""
    nvcc = f"{cuda_home}/bin/nvcc"
    if not os.access(nvcc, os.X_OK):  # run_command would fail without naming the field
        raise NcclBuildError(
            "cuda_home", f"no nvcc at {nvcc}: install the CUDA toolkit there or set cuda_home"
        )
    found = {}
    for key, argv in (("nvcc", [nvcc, "--version"]), ("cxx", ["g++", "--version"])):
        try:
            rc, out, err = run(argv, "/", {})
        except OSError as error:
            raise NcclBuildError("cuda_home", f"cannot run {argv[0]}: {error}") from error
        if rc != 0:
            raise NcclBuildError("cuda_home", f"{' '.join(argv)} failed: {(out + err).strip()[-500:]}")
        lines = [line for line in out.splitlines() if line.strip()]
        release = [line for line in lines if "release" in line or line.startswith("g++")]
        found[key] = (release or lines or ["unknown"])[-1 if key == "nvcc" else 0].strip()
    return found


def read_attestation(dest: str) -> dict | None:
    try:
        with open(os.path.join(dest, ATTESTATION), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def is_current(request: BuildRequest, attestation: dict | None) -> bool:
    """Same inputs and the library on disk is still the one attested: nothing to build."""
    if not attestation or attestation.get("inputs_sha256") != request.identity():
        return False
    library = os.path.join(request.dest, LIBRARY)
    return os.path.isfile(library) and sha256_file(library) == attestation.get("output", {}).get("sha256")


def build(request: BuildRequest, run: Runner) -> dict:
    """Unpack, patch, `make src.build`, then install lib + attestation into dest atomically."""
    identity = request.identity()
    work = Path(request.work_dir) / identity[:16]
    shutil.rmtree(work, ignore_errors=True)
    tree = unpack_pinned(request, work / "src")
    applied = apply_patches(tree, request.patches, run)
    jobs = request.jobs or os.cpu_count() or 1
    argv = [
        "make",
        f"-j{jobs}",
        "-C",
        str(tree),
        MAKE_TARGET,
        f"BUILDDIR={work / 'build'}",
        f"CUDA_HOME={request.cuda_home}",
        f"NVCC_GENCODE={request.nvcc_gencode}",
    ]
    if request.only_funcs:
        argv.append(f"ONLY_FUNCS={request.only_funcs}")
    log = work / BUILD_LOG
    rc = make_logged(argv, tree, log, Path(request.work_dir) / PROGRESS)
    if rc != 0:
        raise NcclBuildError(
            "build", f"make {MAKE_TARGET} failed (rc {rc}), {log} ends: {log_tail(log, 3000)}"
        )
    built = (work / "build" / LIBRARY).resolve()
    if not built.is_file():
        raise NcclBuildError("build", f"make {MAKE_TARGET} succeeded but produced no {LIBRARY}")
    stripped = work / "libnccl.so.2"
    rc, out, err = run([*STRIP, "-o", str(stripped), str(built)], str(work), {})
    if rc != 0:
        raise NcclBuildError("build", f"{' '.join(STRIP)} failed: {(out + err).strip()[-1000:]}")
    attestation = {
        "schema": ATTESTATION_SCHEMA,
        "inputs_sha256": identity,
        "version": request.version,
        "source": {
            "sha256": request.source_sha256,
            "tree_sha256": request.source_tree_sha256,
            "dir": request.source_dir,
        },
        "patches": applied,
        "compilers": request.compilers,
        "flags": request.inputs()["flags"],
        "output": {"path": LIBRARY, "sha256": sha256_file(stripped), "size": stripped.stat().st_size},
    }
    install(request.dest, stripped, attestation)
    shutil.rmtree(work, ignore_errors=True)
    return attestation


def make_logged(argv: list[str], cwd: Path, log: Path, progress: Path) -> int:
    """Run make with its output going to `log`; while it runs, keep `progress` current."""
    started = time.monotonic()
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LANG": "C", "LC_ALL": "C"},
        )
        while True:
            try:
                rc = proc.wait(timeout=PROGRESS_INTERVAL_S)
            except subprocess.TimeoutExpired:
                rc = None
            write_progress(progress, started, log, done=rc is not None)
            if rc is not None:
                return rc


def write_progress(progress: Path, started: float, log: Path, done: bool) -> None:
    """One line a person can watch: `make 4 min 10 s: <the build log's last line>`."""
    elapsed = int(time.monotonic() - started)
    line = log_tail(log, 400).splitlines()[-1:] or ["(no output yet)"]
    phase = f"make {elapsed // 60} min {elapsed % 60:02d} s{' (done)' if done else ''}: {line[0][:160]}"
    write_json_atomic(progress, {"phase": phase, "elapsed_s": elapsed, "log": str(log)})


def log_tail(log: Path, limit: int) -> str:
    """The last `limit` bytes of the build log, as text, without trailing blank lines."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - limit))
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return ""


def install(dest: str, library: Path, attestation: dict) -> None:
    """Stage beside dest, then swap directories: readers see the old build or the new, never half."""
    parent = os.path.dirname(os.path.abspath(dest)) or "/"
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(dest)}.new-{os.getpid()}")
    retired = os.path.join(parent, f".{os.path.basename(dest)}.old-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.join(staging, "lib"))
    shutil.copyfile(library, os.path.join(staging, LIBRARY))
    os.chmod(os.path.join(staging, LIBRARY), 0o755)
    with open(os.path.join(staging, ATTESTATION), "w", encoding="utf-8") as handle:
        json.dump(attestation, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    if os.path.lexists(dest):
        os.rename(dest, retired)
    os.rename(staging, dest)
    shutil.rmtree(retired, ignore_errors=True)


def subprocess_runner(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str, str]:
    """A Runner for callers without AnsibleModule (tests, the device lane)."""
    done = subprocess.run(argv, cwd=cwd, env=os.environ | env, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr
