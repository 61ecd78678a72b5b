#!/usr/bin/python
# Copyright: SparkRing contributors. Apache-2.0.
"""Measure a model for the image lock: every file's path, size and sha256, from a directory or the hub."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_model_pin
short_description: Measure a model's files for the image lock (models.<name>), from a directory or the hub
description:
  - Returns C(model), the entry for C(images/lock.json) C(models.<name>) (role, source, repository or
    generator, revision, and every file's C(path), C(size) and C(sha256)); it writes nothing itself
    (C(playbooks/model-pin.yml) writes the lock on the controller, after C(--check --diff) showed it).
  - With O(path), every regular file under that directory on this host is hashed (rank 0's local disk
    or NFS copy, or the controller's with C(delegate_to)). A symlink anywhere below O(path) is refused,
    as the model stage refuses one in a model directory (the same test), so the pinned tree is regular
    files only; copy the files in (C(cp -rL)) or pin the directory the link points to.
  - Without O(path), the file list comes from the hub's metadata of O(repository) at the commit
    O(revision) (C(/api/models/<repository>/revision/<commit>?blobs=true)); an LFS file's size and
    sha256 are the hub's, the small non-LFS files are downloaded and hashed (and checked against their
    git blob id). Nothing large is downloaded.
  - A hub model is pinned by its exact 40-hex commit; a branch, a tag or a short hash is refused
    before anything is read, naming the field and the fix.
  - File paths are pinned as UTF-8 in Unicode NFC (C(tokenizer-é.json) is pinned as such); a name with
    other characters, or not in NFC, is refused before anything is hashed, naming the file
    (C(module_utils/sparkring_model_names.py), the rule the lock's schema applies).
version_added: "0.1.0"
author: SparkRing contributors
options:
  role:
    description: Whether the model is served as the target or as the speculative draft.
    type: str
    choices: [target, draft]
    default: target
  revision:
    description:
      - With O(repository), the hub commit (40 lower-case hex); with O(generator), the generator's label
        (the launch profile's C(MODEL_REVISION) or C(DRAFT_REVISION) must equal it).
    type: str
    required: true
  repository:
    description:
      - The hub repository, C(org/name); the entry's source is C(hub). Without O(path) the files are
        listed from the hub; with O(path) from that directory, which must hold this commit.
    type: str
  generator:
    description: The project file that generates the model (the sim's C(images/sim-model/generate.py)); the entry's source is C(generated).
    type: str
  path:
    description: A directory on this host holding the model's files under their manifest paths.
    type: path
  exclude:
    description:
      - Paths left out of the pin, as shell patterns matched against each file's relative path (C(*)
        crosses C(/)); the default leaves out a git checkout's and the hub client's own files.
    type: list
    elements: str
    default: [".git/*", ".cache/huggingface/*"]
  hub_endpoint:
    description: The hub's base URL (C(HF_ENDPOINT) for a mirror).
    type: str
    default: https://huggingface.co
  hub_token:
    description: Hub token for gated or private repositories; never logged or written.
    type: str
  timeout:
    description: Seconds each hub request may take.
    type: int
    default: 60
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: The measurement only reads, so check mode runs it (the lock's diff is the playbook's copy task).
  diff_mode:
    support: none
    details: The module changes nothing; C(playbooks/model-pin.yml) shows the lock's diff.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Measure a checkpoint on rank 0's disk, a copy of a hub commit
  sparkring_model_pin:
    repository: zai-org/GLM-4.6
    revision: 0123456789abcdef0123456789abcdef01234567
    path: /srv/models/GLM-4.6
  register: measured

- name: Measure a hub commit from the hub's metadata (only the small files are downloaded)
  sparkring_model_pin:
    role: draft
    repository: Qwen/Qwen3-0.6B
    revision: 89abcdef0123456789abcdef0123456789abcdef
    exclude: ["original/*"]
    hub_token: "{{ lookup('ansible.builtin.env', 'HF_TOKEN') }}"
  delegate_to: localhost
  register: measured
"""

RETURN = r"""
model:
  description: The lock entry, as C(images/lock.json) C(models.<name>) holds it.
  returned: success
  type: dict
  contains:
    role: {description: C(target) or C(draft)., type: str}
    source: {description: C(hub) or C(generated)., type: str}
    repository: {description: The hub repository (source hub)., type: str}
    generator: {description: The generator (source generated)., type: str}
    revision: {description: The commit or the generator's label., type: str}
    files: {description: Every file's C(path), C(size) and C(sha256), sorted by path., type: list, elements: dict}
bytes:
  description: The model's size, all pinned files together.
  returned: success
  type: int
excluded:
  description: Files left out by O(exclude).
  returned: success
  type: list
  elements: str
"""

import fnmatch
import hashlib
import json
import os
from typing import IO
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_integrity import sha256_file
from ansible.module_utils.sparkring_model import symlinks_under, tree_files
from ansible.module_utils.sparkring_model_names import file_name_problem, hub_commit_problem
from ansible.module_utils.urls import open_url

BLOCK = 1 << 20


class ModelPin:
    """One model's manifest, from a directory on this host or from the hub's metadata."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params

    def excluded(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.params["exclude"])

    def check_names(self, names: list[str], where: str) -> None:
        """Before a byte is hashed: every name is one the lock accepts."""
        problems = [problem for problem in map(file_name_problem, names) if problem]
        if problems:
            self.module.fail_json(
                msg=f"{where}: {len(problems)} file name(s) the lock cannot pin: " + "; ".join(problems[:6])
            )

    # -- a directory -----------------------------------------------------------------------------
    def from_directory(self, top: str) -> tuple[list[dict], list[str]]:
        if not os.path.isdir(top):
            self.module.fail_json(
                msg=f"path: {top} is not a directory on this host; name the folder holding the model"
            )
        links = [
            (link, target)
            for link, target in symlinks_under(top)
            if not self.excluded(os.path.relpath(link, top))
        ]
        if links:
            self.module.fail_json(
                msg="path: "
                + "; ".join(f"{link} is a symlink to {target}" for link, target in links[:6])
                + "; a pinned model is regular files only (the model stage refuses links too): copy the files "
                "in (cp -rL) or pin the directory the link points to"
            )
        regular, other = tree_files(top)
        other = [name for name in other if not self.excluded(name)]
        if other:
            self.module.fail_json(
                msg=f"path: {top} holds {other[:6]}, which are not regular files; remove them or exclude them"
            )
        names = sorted(name for name in regular if not self.excluded(name))
        excluded = sorted(name for name in regular if self.excluded(name))
        if not names:
            self.module.fail_json(msg=f"path: {top} holds no file to pin (after exclude)")
        self.check_names(names, f"path {top}")
        files = [
            {
                "path": name,
                "size": os.path.getsize(os.path.join(top, name)),
                "sha256": sha256_file(os.path.join(top, name)),
            }
            for name in names
        ]
        return files, excluded

    # -- the hub ---------------------------------------------------------------------------------
    def request(self, url: str) -> IO[bytes]:
        headers = {}
        if self.params["hub_token"]:
            headers["Authorization"] = f"Bearer {self.params['hub_token']}"
        # The token goes to the hub only, never to a host a redirect names.
        return open_url(
            url,
            headers=headers,
            timeout=self.params["timeout"],
            follow_redirects="safe",
            unredirected_headers=["Authorization"],
            use_netrc=False,
        )

    def from_hub(self) -> tuple[list[dict], list[str]]:
        endpoint = self.params["hub_endpoint"].rstrip("/")
        repository, revision = self.params["repository"], self.params["revision"]
        url = f"{endpoint}/api/models/{repository}/revision/{revision}?blobs=true"
        try:
            with self.request(url) as response:
                info = json.load(response)
        except Exception as error:  # urllib and open_url raise many kinds; each names the problem
            self.module.fail_json(
                msg=f"repository: reading {url} failed: {type(error).__name__}: {error}; check the repository and "
                "commit, HF_TOKEN for a gated or private one, and hub_endpoint"
            )
        if info.get("sha") != revision:
            self.module.fail_json(
                msg=f"revision: the hub answered for commit {info.get('sha')!r}, not {revision}; pin the commit it names"
            )
        siblings = info.get("siblings") or []
        names = sorted(s["rfilename"] for s in siblings if not self.excluded(s["rfilename"]))
        excluded = sorted(s["rfilename"] for s in siblings if self.excluded(s["rfilename"]))
        if not names:
            self.module.fail_json(
                msg=f"repository: {repository}@{revision} lists no file to pin (after exclude)"
            )
        self.check_names(names, f"{repository}@{revision}")
        listed = {s["rfilename"]: s for s in siblings}
        files = []
        for name in names:
            sibling = listed[name]
            lfs = sibling.get("lfs")
            if lfs:
                if sibling.get("size") not in (None, lfs["size"]):
                    self.module.fail_json(
                        msg=f"{name}: the hub lists size {sibling['size']} and LFS size {lfs['size']}"
                    )
                files.append({"path": name, "size": lfs["size"], "sha256": lfs["sha256"]})
            else:
                files.append(self.hashed_download(endpoint, name, sibling))
        return files, excluded

    def hashed_download(self, endpoint: str, name: str, sibling: dict) -> dict:
        """A small (non-LFS) file: downloaded at the commit, checked against its size and git blob id."""
        repository, revision = self.params["repository"], self.params["revision"]
        url = f"{endpoint}/{repository}/resolve/{revision}/{quote(name)}"
        listed = int(sibling.get("size") or 0)
        sha256, size = hashlib.sha256(), 0
        blob = hashlib.sha1(b"blob %d\0" % listed)  # git's object id, as the hub lists it
        try:
            with self.request(url) as response:
                for block in iter(lambda: response.read(BLOCK), b""):
                    sha256.update(block)
                    blob.update(block)
                    size += len(block)
        except Exception as error:  # urllib and open_url raise many kinds; each names the problem
            self.module.fail_json(msg=f"{name}: downloading {url} failed: {type(error).__name__}: {error}")
        if size != sibling.get("size") or blob.hexdigest() != sibling.get("blobId"):
            self.module.fail_json(
                msg=f"{name}: {url} sent {size} bytes with git blob id {blob.hexdigest()}; the hub's metadata lists "
                f"{sibling.get('size')} bytes, {sibling.get('blobId')}: rerun, or check hub_endpoint"
            )
        return {"path": name, "size": size, "sha256": sha256.hexdigest()}

    def run(self) -> dict:
        params = self.params
        if params["repository"]:
            problem = hub_commit_problem(params["revision"])
            if problem:
                self.module.fail_json(msg=problem)
        if params["path"]:
            files, excluded = self.from_directory(params["path"])
        else:
            files, excluded = self.from_hub()
        model = {"role": params["role"]}
        if params["repository"]:
            model.update(source="hub", repository=params["repository"])
        else:
            model.update(source="generated", generator=params["generator"])
        model.update(revision=params["revision"], files=files)
        return {
            "changed": False,
            "model": model,
            "bytes": sum(f["size"] for f in files),
            "excluded": excluded,
        }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "role": {"type": "str", "choices": ["target", "draft"], "default": "target"},
            "revision": {"type": "str", "required": True},
            "repository": {"type": "str"},
            "generator": {"type": "str"},
            "path": {"type": "path"},
            "exclude": {"type": "list", "elements": "str", "default": [".git/*", ".cache/huggingface/*"]},
            "hub_endpoint": {"type": "str", "default": "https://huggingface.co"},
            "hub_token": {"type": "str", "no_log": True},
            "timeout": {"type": "int", "default": 60},
        },
        required_one_of=[("repository", "generator")],
        mutually_exclusive=[("repository", "generator")],
        required_by={"generator": ("path",)},
        supports_check_mode=True,
    )
    module.exit_json(**ModelPin(module).run())


if __name__ == "__main__":
    main()
