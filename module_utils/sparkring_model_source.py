# Copyright: SparkRing contributors. Apache-2.0.
"""Where rank 0 obtains the pinned model files it lacks: a source directory or the hub (stdlib only).

Each file lands in the model's staging directory (module_utils/sparkring_model.py), hashed as it
arrives, and is named there only once its size and sha256 are the lock's; the hub client
(huggingface_hub, installed on rank 0 by the model role) is imported only when a hub source is used.
"""

from __future__ import annotations

import os
import sys

from ansible.module_utils.sparkring_fanout_manifest import Manifest, ManifestBuilder, build_manifest
from ansible.module_utils.sparkring_model import Layout

MIB = 1024 * 1024


class SourceError(Exception):
    """A pinned file cannot be obtained as pinned; the message names the file and the fix."""


def hub_download(repository: str, revision: str, name: str, local_dir: str, token: str | None) -> str:
    """One file from the hub at the exact commit into local_dir (resumes a partial download)."""
    from huggingface_hub import hf_hub_download  # rank 0's hub venv; the model role installs it

    return hf_hub_download(
        repo_id=repository, filename=name, revision=revision, local_dir=local_dir, token=token or None
    )


class ModelSource:
    """The sparkring_model module's source options (source, source_dir, repository, hub_token, chunk_size)
    for one model whose files land in `where`; `who` names the rank in messages."""

    def __init__(self, params: dict, where: Layout, pins: dict[str, dict], who: str) -> None:
        self.params = params
        self.where = where
        self.pins = pins
        self.who = who
        self.model = f"{params['name']} {params['revision']}"

    def check(self, lacks: list[str]) -> None:
        """Before anything is copied: a source directory holds every lacking file at its pinned size."""
        source = self.params["source_dir"]
        if self.params["source"] != "dir" or not lacks:
            return
        if not source or not os.path.isdir(source):
            raise SourceError(
                f"{self.who}: source_dir {source!r} is not a directory here; name the folder holding "
                f"{self.model} in model_sources (inventory), or pin a hub source"
            )
        wrong = []
        for name in lacks:
            path = os.path.join(source, name)
            if not os.path.isfile(path):
                wrong.append(f"{name}: missing")
            elif os.path.getsize(path) != self.pins[name]["size"]:
                wrong.append(f"{name}: {os.path.getsize(path)} bytes, pinned {self.pins[name]['size']}")
        if wrong:
            raise SourceError(
                f"{self.who}: {source} does not hold {self.model} as pinned: "
                + "; ".join(wrong[:6])
                + "; put the pinned revision there (or fix the lock)"
            )

    def fetch(self, name: str) -> dict:
        """One lacking file into staging, hashed as it lands, named only once it matches the pin;
        returns its chunk manifest."""
        pin = self.pins[name]
        final = os.path.join(self.where.staging, name)
        builder = ManifestBuilder(self.params["chunk_size"])
        if self.params["source"] == "hub":
            source = self._download(name)
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
            raise SourceError(
                f"{self.who}: {name} from {source} is {manifest.size} bytes, sha256 {manifest.sha256}; the lock "
                f"pins {pin['size']} bytes, {pin['sha256']} ({self.model}); the source does not hold the pinned "
                "revision"
            )
        os.replace(landed, final)
        return manifest.to_dict()

    def _download(self, name: str) -> str:
        """The hub's copy of one file at the pinned commit, in a download folder beside staging."""
        repository, revision = self.params["repository"], self.params["revision"]
        try:
            return hub_download(repository, revision, name, self.where.download, self.params["hub_token"])
        except ImportError as error:
            raise SourceError(
                f"{self.who}: huggingface_hub is not importable by {sys.executable}; the model role "
                "installs it into model_hub_venv for hub models, or name a source directory in model_sources"
            ) from error
        except Exception as error:  # the hub client raises many kinds; each names the problem
            raise SourceError(
                f"{self.who}: downloading {name} of {repository}@{revision} failed: "
                f"{type(error).__name__}: {error}; rerun to resume, or use a source directory"
            ) from error

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
