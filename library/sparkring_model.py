#!/usr/bin/python
# Copyright: SparkRing contributors. Apache-2.0.
"""Obtain a pinned model once on rank 0 and fan it out, verified, over the ring links."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_model
short_description: Obtain a pinned model on rank 0 and fan it out, verified, over the ring links
description:
  - Keeps one model directory (the launch profile's C(MODEL_PATH) or C(DRAFT_PATH)) on a rank exactly
    equal to the lock's manifest of that model (every file's path, size and sha256).
  - C(state=obtained) (rank 0) fetches the files it lacks once, from O(source_dir) (a local disk or NFS
    copy) or from the model hub (C(huggingface_hub), O(repository) at the pinned O(revision), resumable,
    O(hub_token) never logged), verifies each against the manifest and returns the chunk manifest the
    other ranks receive; it travels through Ansible, never over the data links.
  - C(state=present) (every rank, all at once) receives what the rank lacks over the direct ring links,
    both directions, through the same relay as the image fan-out (C(module_utils/sparkring_fanout.py)),
    with chunk sha256s checked on arrival, resume from verified chunks, data accepted only from the ring
    neighbour on that cable, free space checked before any byte moves, optional rate pacing, a progress
    file.
  - Files are assembled in a staging directory beside O(path) (verified files already at O(path) are
    hard-linked, not copied; a damaged one is resumed from its chunks that still verify). O(path) is
    replaced only by an atomic exchange with the complete, verified staging directory, so the launch
    never mounts a half-written file. Files not in the manifest leave with the old directory.
  - A record beside O(path) (C(.sparkring-models/<name>.json)) keeps the manifest digest and each
    file's stat stamp once verified; a later run, the preflight and the launch attestation trust a
    file only while its stamp is unchanged (any write moves its ctime), else it is hashed again.
  - A rank that already holds every pinned file, and nothing else, moves nothing and reports no change.
version_added: "0.1.0"
author: SparkRing contributors
options:
  state:
    description: C(obtained) on rank 0, C(present) on every rank.
    type: str
    choices: [obtained, present]
    default: present
  name:
    description: The lock's models entry (for messages and the record).
    type: str
    required: true
  revision:
    description: The pinned revision (a hub commit, or the generator's label).
    type: str
    required: true
  path:
    description: The model directory the launch mounts (C(MODEL_PATH) or C(DRAFT_PATH)).
    type: path
    required: true
  files:
    description: The lock's manifest of the model, one entry per file with C(path), C(size) and C(sha256).
    type: list
    elements: dict
    required: true
  source:
    description: Where rank 0 obtains lacking files (C(state=obtained)).
    type: str
    choices: [dir, hub]
    default: dir
  source_dir:
    description: Directory on rank 0 holding the pinned files under their manifest paths (C(source=dir)).
    type: path
  repository:
    description: Hub repository id, C(org/name) (C(source=hub)).
    type: str
  hub_token:
    description: Hub token for gated or private repositories (C(source=hub)); never logged or written.
    type: str
  chunk_size:
    description: Bytes per verified chunk when rank 0 hashes files.
    type: int
    default: 16777216
  verify:
    description:
      - C(stat) trusts a file whose stat stamp equals the record's (any write moves its ctime) and hashes
        the rest; C(full) hashes every file on every run.
    type: str
    choices: [stat, full]
    default: stat
  fileset:
    description: The chunk manifest C(state=obtained) returned on rank 0 (C(state=present)).
    type: list
    elements: dict
  port:
    description: TCP port the transfer listens on, on the ring addresses only.
    type: int
    default: 29620
  reserve_bytes:
    description: Bytes that must stay free beside O(path) after the files arrive; checked before any byte moves.
    type: int
    default: 1073741824
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_fanout
attributes:
  check_mode:
    support: full
    details: Reports, per rank, the files it lacks and their bytes, and checks disk space and the source; nothing moves.
  diff_mode:
    support: full
    details: Before/after of every file of the model directory (verified, lacking with bytes, not in the manifest).
  platform:
    platforms: posix
requirements:
  - huggingface_hub on rank 0 for C(source=hub) (the model role installs it into a venv there)
"""

EXAMPLES = r"""
- name: Obtain the model once on rank 0 (from a local copy)
  sparkring_model:
    state: obtained
    name: sim-target
    revision: sim-tiny-v1
    path: /opt/sparkring/models/sim-tiny
    files: "{{ pin.files }}"
    source: dir
    source_dir: /srv/model-cache/sim-tiny
  register: obtained
  when: sparkring_rank == 0

- name: Fan it out over the ring links to every rank
  sparkring_model:
    state: present
    name: sim-target
    revision: sim-tiny-v1
    path: /opt/sparkring/models/sim-tiny
    files: "{{ pin.files }}"
    fileset: "{{ hostvars[groups['sparkring_head'][0]].obtained.fileset }}"
    rank: "{{ sparkring_rank }}"
    world_size: "{{ sparkring_world_size }}"
    ports: "{{ sparkring_ports }}"
"""

RETURN = r"""
path:
  description: The model directory on this rank.
  returned: always
  type: str
progress:
  description: The progress file the transfer (or rank 0's obtain) keeps; C(sparkring_job_progress) reads it.
  returned: always
  type: str
manifest_sha256:
  description: The manifest digest of the pinned files (what the launch attests on every rank).
  returned: always
  type: str
lacks:
  description: Pinned files this rank did not hold, verified, before the run; empty means nothing moves.
  returned: always
  type: list
  elements: str
lacks_bytes:
  description: Bytes still to obtain or receive for those files (a resumed partial file counts only what it lacks).
  returned: always
  type: int
extras:
  description: Entries in the model directory that are not in the manifest (they leave with the old directory).
  returned: always
  type: list
  elements: str
record:
  description: C(current) when the record matched every file before the run, else C(stale) or C(absent).
  returned: always
  type: str
fileset:
  description: Per file name, size, sha256, chunk size and chunk sha256s (the fan-out's manifest).
  returned: state=obtained and not check mode
  type: list
  elements: dict
obtained_bytes:
  description: Bytes rank 0 copied or downloaded in this run.
  returned: state=obtained
  type: int
received_bytes:
  description: Bytes received over the ring links in this run (resumed chunks are not counted).
  returned: state=present
  type: int
resumed_chunks:
  description: Chunks already here (an interrupted transfer, a damaged copy) kept because they still matched the manifest.
  returned: state=present
  type: int
rejected_chunks:
  description: Chunks that failed verification on arrival and were asked for again.
  returned: state=present
  type: int
sent_bytes:
  description: Bytes this rank sent to each neighbour rank.
  returned: state=present
  type: dict
refused:
  description: Connections refused because they did not come from the ring neighbour on that cable.
  returned: state=present
  type: list
  elements: dict
"""

import os
import shutil
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_fanout import (
    TRANSFER_OPTIONS,
    FanoutError,
    FileSet,
    Manifest,
    ManifestBuilder,
    RankAgent,
    Stats,
    build_manifest,
    free_bytes,
    fsync_dir,
    rank_config,
    transfer_result,
)
from ansible.module_utils.sparkring_integrity import sha256_file, write_json_atomic
from ansible.module_utils.sparkring_model import (
    exchange,
    layout,
    make_read_only,
    pinned_digest,
    read_record,
    remove_tree,
    stamp,
    tree_files,
    write_record,
)

MIB = 1024 * 1024


def hub_download(repository: str, revision: str, name: str, local_dir: str, token: str | None) -> str:
    """One file from the hub at the exact commit into local_dir (resumes a partial download)."""
    from huggingface_hub import hf_hub_download  # rank 0's hub venv; the model role installs it

    return hf_hub_download(
        repo_id=repository, filename=name, revision=revision, local_dir=local_dir, token=token or None
    )


class ModelStage:
    """One rank's view of one model: what it holds, what it lacks, and the work to close the gap."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.where = layout(self.params["path"])
        self.files = sorted(self.params["files"], key=lambda f: f["path"])
        self.pins = {f["path"]: f for f in self.files}
        self.digest = pinned_digest(self.files)
        rank = self.params["rank"]
        self.who = f"rank {rank}" if rank is not None else "this rank"

    # -- what this rank holds --------------------------------------------------------------------
    def assess(self) -> dict:
        """Per pinned file: verified at PATH (by the record's stamp, else by hashing) or lacking."""
        record = read_record(self.where)
        recorded = {}
        if record and record.get("manifest_sha256") == self.digest:
            recorded = {entry["path"]: entry for entry in record["files"]}
        verified, lacks, stamps_ok = [], [], bool(recorded)
        for pin in self.files:
            full = os.path.join(self.where.path, pin["path"])
            if not os.path.isfile(full) or os.path.islink(full) or os.path.getsize(full) != pin["size"]:
                lacks.append(pin["path"])
                stamps_ok = False
                continue
            entry = recorded.get(pin["path"], {})
            same = entry.get("sha256") == pin["sha256"] and entry.get("stamp") == stamp(full)
            stamps_ok = stamps_ok and same
            if (same and self.params["verify"] == "stat") or sha256_file(full) == pin["sha256"]:
                verified.append(pin["path"])
            else:
                lacks.append(pin["path"])
        extras = []
        if os.path.isdir(self.where.path) and not os.path.islink(self.where.path):
            regular, other = tree_files(self.where.path)
            extras = sorted(set(regular) - set(self.pins)) + other
        elif os.path.lexists(self.where.path):
            extras = [f"{self.where.path} (not a directory)"]
        state = "current" if stamps_ok and not extras else ("stale" if record else "absent")
        return {
            "verified": verified,
            "lacks": lacks,
            "extras": extras,
            "record": state,
            "chunks": {name: recorded[name] for name in verified if recorded.get(name, {}).get("chunks")},
        }

    def lacks_bytes(self, lacks: list[str]) -> int:
        """Bytes still to move for these files: a resumable partial in staging counts what it holds."""
        needed = 0
        for name in lacks:
            partial = os.path.join(self.where.staging, name + ".partial")
            held = os.stat(partial).st_blocks * 512 if os.path.exists(partial) else 0
            needed += max(0, self.pins[name]["size"] - held)
        return needed

    def plan(self, held: dict) -> dict:
        """The result a check run returns: what this rank lacks, in files and bytes, and the diff."""
        lacks_bytes = self.lacks_bytes(held["lacks"])
        result = {
            "path": self.where.path,
            "progress": self.where.progress,
            "manifest_sha256": self.digest,
            "lacks": held["lacks"],
            "lacks_bytes": lacks_bytes,
            "extras": held["extras"],
            "record": held["record"],
            "changed": bool(held["lacks"] or held["extras"] or held["record"] != "current"),
        }
        if self.module._diff:
            lacking = set(held["lacks"])
            before = [
                f"{pin['path']} {pin['size']} {'lacking' if pin['path'] in lacking else 'verified'}"
                for pin in self.files
            ] + [f"{name} not in the manifest" for name in held["extras"]]
            after = [
                f"{pin['path']} {pin['size']}"
                + (f" (moves {pin['size']} bytes)" if pin["path"] in lacking else "")
                for pin in self.files
            ]
            result["diff"] = {
                "before_header": f"{self.who}: {self.where.path} (now)",
                "after_header": f"{self.who}: {self.where.path} ({self.params['name']} {self.params['revision']}, "
                f"{len(held['lacks'])} files, {lacks_bytes} bytes to move)",
                "before": "\n".join(before) + "\n",
                "after": "\n".join(after) + "\n",
            }
        return result

    def check_space(self, needed: int) -> None:
        """Before any byte moves: the lacking files fit beside PATH and the reserve stays free."""
        probe = os.path.dirname(self.where.path)
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        free, reserve = free_bytes(probe), self.params["reserve_bytes"]
        if free - needed < reserve:
            self.fail(
                f"{self.who}: {self.params['name']} needs {needed} more bytes at {self.where.path} and "
                f"{reserve} must stay free, but {probe} has {free} bytes free; free space there or lower "
                "model_reserve_bytes"
            )

    def check_filesystem(self) -> None:
        """Staging, hard links and the exchange need PATH and its store on one filesystem."""
        if os.path.isdir(self.where.path) and os.path.ismount(self.where.path):
            self.fail(
                f"{self.who}: {self.where.path} is a mount point; the model stage stages beside it on the "
                "same filesystem: point MODEL_PATH/DRAFT_PATH at a directory inside that mount"
            )

    # -- staging and promotion -------------------------------------------------------------------
    def prepare_staging(self, held: dict) -> frozenset[str]:
        """Verified files hard-linked in, stale leftovers out, damaged copies kept as resumable partials.

        Returns the names complete in staging."""
        staging = self.where.staging
        os.makedirs(staging, exist_ok=True)
        complete = set()
        for pin in self.files:
            final = os.path.join(staging, pin["path"])
            partial = final + ".partial"
            current = os.path.join(self.where.path, pin["path"])
            os.makedirs(os.path.dirname(final), exist_ok=True)
            if pin["path"] in held["verified"]:
                if os.path.lexists(final) and not os.path.samefile(final, current):
                    os.unlink(final)
                if not os.path.lexists(final):
                    os.link(current, final)
                complete.add(pin["path"])
                continue
            if os.path.lexists(final):  # renamed by an interrupted run: keep it only if it verifies
                if os.path.isfile(final) and sha256_file(final) == pin["sha256"]:
                    complete.add(pin["path"])
                    continue
                os.unlink(final)
            if not os.path.exists(partial) and os.path.isfile(current) and not os.path.islink(current):
                shutil.copyfile(current, partial)  # a damaged copy: its good chunks are kept
        wanted = set(self.pins) | {name + ".partial" for name in self.pins}
        regular, other = tree_files(staging)
        for name in [n for n in regular if n not in wanted] + other:
            path = os.path.join(staging, name)
            (remove_tree if os.path.isdir(path) and not os.path.islink(path) else os.unlink)(path)
        return frozenset(complete)

    def promote(self) -> None:
        """Swap the complete staging directory in for PATH, atomically, then drop the old files."""
        make_read_only(self.where.staging)
        exchange(self.where.staging, self.where.path)
        fsync_dir(os.path.dirname(self.where.path))
        remove_tree(self.where.staging)

    def record(self, manifests: list[dict]) -> None:
        meta = {"name": self.params["name"], "revision": self.params["revision"]}
        write_record(self.where, meta, manifests)

    # -- rank 0 ----------------------------------------------------------------------------------
    def obtained(self) -> dict:
        self.check_filesystem()
        held = self.assess()
        result = self.plan(held)
        if self.params["source"] == "dir":
            self.check_source(held["lacks"])
        self.check_space(result["lacks_bytes"])
        if self.module.check_mode:
            return {**result, "obtained_bytes": 0}
        manifests = {}
        obtained = 0
        if held["lacks"] or held["extras"]:
            complete = self.prepare_staging(held)
            lacking = [name for name in held["lacks"] if name not in complete]
            for index, name in enumerate(lacking):
                self.progress(
                    f"obtaining {index + 1}/{len(lacking)}: {name} ({self.pins[name]['size']} bytes)"
                )
                manifests[name] = self.fetch(name)
                obtained += self.pins[name]["size"]
            self.promote()
            remove_tree(self.where.download)  # the hub client's resume state, once every file verified
        for name in self.pins:
            if name not in manifests:
                manifests[name] = self.chunk_manifest(name, held["chunks"].get(name))
        listed = [manifests[name] for name in sorted(manifests)]
        if result["changed"]:
            self.record(listed)
        self.progress("obtained")
        return {**result, "fileset": listed, "obtained_bytes": obtained}

    def check_source(self, lacks: list[str]) -> None:
        """Before anything is copied: the source directory holds every lacking file at its pinned size."""
        source = self.params["source_dir"]
        if not lacks:
            return
        if not source or not os.path.isdir(source):
            self.fail(
                f"{self.who}: source_dir {source!r} is not a directory here; name the folder holding "
                f"{self.params['name']} {self.params['revision']} in model_sources (inventory), or pin a hub source"
            )
        wrong = []
        for name in lacks:
            path = os.path.join(source, name)
            if not os.path.isfile(path):
                wrong.append(f"{name}: missing")
            elif os.path.getsize(path) != self.pins[name]["size"]:
                wrong.append(f"{name}: {os.path.getsize(path)} bytes, pinned {self.pins[name]['size']}")
        if wrong:
            self.fail(
                f"{self.who}: {source} does not hold {self.params['name']} {self.params['revision']} as pinned: "
                + "; ".join(wrong[:6])
                + "; put the pinned revision there (or fix the lock)"
            )

    def fetch(self, name: str) -> dict:
        """One lacking file into staging, hashed as it lands, named only once it matches the pin."""
        pin = self.pins[name]
        final = os.path.join(self.where.staging, name)
        builder = ManifestBuilder(self.params["chunk_size"])
        if self.params["source"] == "hub":
            source = self.download(name)
            with open(source, "rb") as reader:
                for block in iter(lambda: reader.read(4 * MIB), b""):
                    builder.update(block)
            landed = source
        else:
            source = os.path.join(self.params["source_dir"], name)
            landed = final + ".partial"
            with open(source, "rb") as reader, open(landed, "wb") as writer:
                for block in iter(lambda: reader.read(4 * MIB), b""):
                    builder.update(block)
                    writer.write(block)
                writer.flush()
                os.fsync(writer.fileno())
        manifest = builder.finish(name)
        if manifest.size != pin["size"] or manifest.sha256 != pin["sha256"]:
            os.unlink(landed)
            self.fail(
                f"{self.who}: {name} from {source} is {manifest.size} bytes, sha256 {manifest.sha256}; the lock "
                f"pins {pin['size']} bytes, {pin['sha256']} ({self.params['name']} {self.params['revision']}); "
                "the source does not hold the pinned revision"
            )
        os.replace(landed, final)
        return manifest.to_dict()

    def download(self, name: str) -> str:
        """The hub's copy of one file at the pinned commit, in a download folder beside staging."""
        try:
            return hub_download(
                self.params["repository"],
                self.params["revision"],
                name,
                self.where.download,
                self.params["hub_token"],
            )
        except ImportError:
            self.fail(
                f"{self.who}: huggingface_hub is not importable by {sys.executable}; the model role "
                "installs it into model_hub_venv for hub models, or name a source directory in model_sources"
            )
        except Exception as error:  # the hub client raises many kinds; each names the problem
            self.fail(
                f"{self.who}: downloading {name} of {self.params['repository']}@{self.params['revision']} "
                f"failed: {type(error).__name__}: {error}; rerun to resume, or use a source directory"
            )

    def chunk_manifest(self, name: str, entry: dict | None) -> dict:
        """A verified file's chunk manifest: from the record when it has one, else hashed now."""
        pin = self.pins[name]
        if entry and entry.get("chunks"):
            return Manifest(
                name=name,
                sha256=pin["sha256"],
                size=pin["size"],
                chunk_size=entry["chunk_size"],
                chunks=tuple(entry["chunks"]),
            ).to_dict()
        path = os.path.join(self.where.path, name)
        return build_manifest(path, self.params["chunk_size"], name=name).to_dict()

    # -- every rank ------------------------------------------------------------------------------
    def present(self) -> dict:
        self.check_filesystem()
        held = self.assess()
        result = self.plan(held)
        result.update(transfer_result(Stats()))
        self.check_space(result["lacks_bytes"])
        if self.module.check_mode:
            return result
        fileset = self.fileset()
        if held["lacks"] and not self.params["transfer"]:
            self.fail(
                f"{self.who} lacks {held['lacks'][:4]} but transfer is false; let the role decide transfer"
            )
        dest, complete = self.where.path, frozenset(self.pins)
        if held["lacks"] or held["extras"]:
            dest, complete = self.where.staging, self.prepare_staging(held)
        if self.params["transfer"]:
            result.update(self.transfer(fileset, dest, complete))
        if held["lacks"] or held["extras"]:
            self.promote()
        if result["changed"]:
            self.record(fileset.to_list())
        return result

    def fileset(self) -> FileSet:
        """Rank 0's chunk manifest, which must describe exactly the pinned files."""
        try:
            fileset = FileSet.from_list(self.params["fileset"] or [])
        except (FanoutError, KeyError, TypeError) as error:
            self.fail(f"fileset: {error}; pass the fileset state=obtained returned on rank 0")
        offered = sorted((m.name, m.size, m.sha256) for m in fileset.files)
        pinned = sorted((f["path"], f["size"], f["sha256"]) for f in self.files)
        if offered != pinned:
            self.fail(f"fileset: rank 0's files are not the pinned manifest {self.digest}; rerun the stage")
        return fileset

    def transfer(self, fileset: FileSet, dest: str, complete: frozenset[str]) -> dict:
        config = rank_config(self.params, fileset, dest, self.where.progress, complete)
        try:
            return transfer_result(RankAgent(config).run())
        except (FanoutError, OSError) as error:
            self.fail(f"{self.who}: fan-out of {self.params['name']} failed: {error}")

    # -- reporting -------------------------------------------------------------------------------
    def progress(self, phase: str) -> None:
        """Tell whoever follows the progress file what rank 0 is doing now."""
        os.makedirs(self.where.store, exist_ok=True)
        write_json_atomic(
            self.where.progress,
            {"rank": self.params["rank"], "phase": phase, "pid": os.getpid(), "time": time.time()},
        )

    def fail(self, msg: str) -> None:
        self.module.fail_json(msg=msg, path=self.where.path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["obtained", "present"], "default": "present"},
            "name": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "path": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
            "source": {"type": "str", "choices": ["dir", "hub"], "default": "dir"},
            "source_dir": {"type": "path"},
            "repository": {"type": "str"},
            "hub_token": {"type": "str", "no_log": True},
            "chunk_size": {"type": "int", "default": 16 * MIB},
            "verify": {"type": "str", "choices": ["stat", "full"], "default": "stat"},
            "fileset": {"type": "list", "elements": "dict"},
            **TRANSFER_OPTIONS,
            "port": {"type": "int", "default": 29620},
            "reserve_bytes": {"type": "int", "default": 1 << 30},
        },
        required_if=[
            ("source", "hub", ("repository",)),
            ("state", "present", ("rank", "world_size", "ports")),
        ],
        supports_check_mode=True,
    )
    for index, entry in enumerate(module.params["files"]):
        missing = [key for key in ("path", "size", "sha256") if key not in entry]
        if missing:
            module.fail_json(msg=f"files[{index}]: missing {missing}; pass the lock's manifest of the model")
    stage = ModelStage(module)
    try:
        result = stage.obtained() if module.params["state"] == "obtained" else stage.present()
    except (FanoutError, OSError) as error:
        module.fail_json(msg=f"{stage.who}: {module.params['name']} at {module.params['path']}: {error}")
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
