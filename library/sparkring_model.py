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
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_fanout import (
    TRANSFER_OPTIONS,
    RankAgent,
    Stats,
    rank_config,
    transfer_result,
)
from ansible.module_utils.sparkring_fanout_manifest import FanoutError, FileSet
from ansible.module_utils.sparkring_fanout_store import free_bytes
from ansible.module_utils.sparkring_integrity import write_json_atomic
from ansible.module_utils.sparkring_model import (
    assess,
    lacks_bytes,
    layout,
    pinned_digest,
    prepare_staging,
    promote,
    remove_tree,
    symlinks,
    write_record,
)
from ansible.module_utils.sparkring_model_source import MIB, ModelSource, SourceError


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
    def plan(self, held: dict) -> dict:
        """The result a check run returns: what this rank lacks, in files and bytes, and the diff."""
        needed = lacks_bytes(self.where, self.files, held["lacks"])
        result = {
            "path": self.where.path,
            "progress": self.where.progress,
            "manifest_sha256": self.digest,
            "lacks": held["lacks"],
            "lacks_bytes": needed,
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
                f"{len(held['lacks'])} files, {needed} bytes to move)",
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
        """What the stage writes stays at PATH: staging, hard links and the exchange need PATH and its
        store on one filesystem, and no symlink there may lead them to files elsewhere."""
        if os.path.isdir(self.where.path) and os.path.ismount(self.where.path):
            self.fail(
                f"{self.who}: {self.where.path} is a mount point; the model stage stages beside it on the "
                "same filesystem: point MODEL_PATH/DRAFT_PATH at a directory inside that mount"
            )
        links = symlinks(self.where)
        if links:
            self.fail(
                f"{self.who}: "
                + "; ".join(f"{link} is a symlink to {target}" for link, target in links[:6])
                + f"; the model stage writes, hard-links and chmods what it finds at {self.where.path} and "
                "beside it, so it keeps them free of links: remove the link (what it points to stays "
                "untouched; the next run obtains the pinned files), or point MODEL_PATH/DRAFT_PATH at the "
                "real directory"
            )

    # -- rank 0 ----------------------------------------------------------------------------------
    def obtained(self) -> dict:
        self.check_filesystem()
        held = assess(self.where, self.files, self.params["verify"])
        result = self.plan(held)
        source = ModelSource(self.params, self.where, self.pins, self.who)
        try:
            source.check(held["lacks"])
            self.check_space(result["lacks_bytes"])
            if self.module.check_mode:
                return {**result, "obtained_bytes": 0}
            manifests, obtained = self.obtain(source, held)
        except SourceError as error:
            self.fail(str(error))
        for name in self.pins:
            if name not in manifests:
                manifests[name] = source.chunk_manifest(name, held["chunks"].get(name))
        listed = [manifests[name] for name in sorted(manifests)]
        if result["changed"]:
            self.record(listed)
        self.progress("obtained")
        return {**result, "fileset": listed, "obtained_bytes": obtained}

    def obtain(self, source: ModelSource, held: dict) -> tuple[dict, int]:
        """Every lacking file from the source into staging, then staging in for PATH; returns the
        obtained files' chunk manifests and their bytes."""
        manifests, obtained = {}, 0
        if not (held["lacks"] or held["extras"]):
            return manifests, obtained
        complete = prepare_staging(self.where, self.files, held["verified"])
        lacking = [name for name in held["lacks"] if name not in complete]
        for index, name in enumerate(lacking):
            self.progress(f"obtaining {index + 1}/{len(lacking)}: {name} ({self.pins[name]['size']} bytes)")
            manifests[name] = source.fetch(name)
            obtained += self.pins[name]["size"]
        promote(self.where)
        remove_tree(self.where.download)  # the hub client's resume state, once every file verified
        return manifests, obtained

    # -- every rank ------------------------------------------------------------------------------
    def present(self) -> dict:
        self.check_filesystem()
        held = assess(self.where, self.files, self.params["verify"])
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
            dest, complete = self.where.staging, prepare_staging(self.where, self.files, held["verified"])
        if self.params["transfer"]:
            result.update(self.transfer(fileset, dest, complete))
        if held["lacks"] or held["extras"]:
            promote(self.where)
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
    def record(self, manifests: list[dict]) -> None:
        """The record beside PATH: the manifest digest and each file's stamp as verified now."""
        meta = {"name": self.params["name"], "revision": self.params["revision"]}
        write_record(self.where, meta, manifests)

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
