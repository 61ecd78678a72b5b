#!/usr/bin/python
# Copyright: SparkRing contributors. Apache-2.0.
"""Export one checksum-bound image archive on rank 0 and fan it out over the direct ring links."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_image_fanout
short_description: Export a container image archive and fan it out, verified, over the ring links
description:
  - C(state=exported) (rank 0) writes C(docker save IMAGE | zstd) to O(dest) under a name bound to the
    image ID, hashes it (whole and per chunk) and returns the manifest; the manifest is known before any
    byte moves, and it travels to the other ranks through Ansible, never over the data links.
  - C(state=present) (every rank, all at once) makes the verified archive and the loaded image present.
    Each rank listens on its ring addresses and accepts data only from the ring neighbour the inventory
    puts on that cable; relays forward every chunk as soon as it is verified, along both directions of
    the ring. Every chunk and the whole archive are checked against the manifest, a C(.partial) file gets
    the final name only once verified, and a rerun resumes from the chunks already verified.
  - Then C(zstd -dc | docker load) where the image is missing, and an identity check (image ID) everywhere.
  - A rank that holds the verified archive and the identical image moves nothing and reports no change.
version_added: "0.1.0"
author: SparkRing contributors
options:
  state:
    description: C(exported) on the source rank, C(present) on every rank.
    type: str
    choices: [exported, present]
    default: present
  dest:
    description: Directory that holds the archive on every rank.
    type: path
    required: true
  image:
    description: Image reference to export (C(state=exported)).
    type: str
  chunk_size:
    description: Bytes per verified chunk (C(state=exported)).
    type: int
    default: 8388608
  compression_level:
    description: zstd level for the export.
    type: int
    default: 3
  manifest:
    description: The manifest C(state=exported) returned (C(state=present)).
    type: dict
  port:
    description: TCP port the fan-out listens on, on the ring addresses only.
    type: int
    default: 29610
  reserve_bytes:
    description: Bytes that must stay free in O(dest) (and in Docker's root) after the transfer.
    type: int
    default: 1073741824
  load:
    description: Load the image into Docker when it is missing and check its identity.
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
  - sparkring_fanout
attributes:
  check_mode:
    support: full
    details: Reports what this rank lacks (archive, image) and checks disk space; nothing moves.
  diff_mode:
    support: full
    details: Before/after of the archive state and the image ID.
  platform:
    platforms: posix
requirements: [docker, zstd]
"""

EXAMPLES = r"""
- name: Export the runtime image on rank 0
  sparkring_image_fanout:
    state: exported
    image: sparkring/runtime:sim
    dest: /var/lib/sparkring/images
  register: export
  when: sparkring_rank == 0

- name: Fan it out over the ring links and load it everywhere
  sparkring_image_fanout:
    state: present
    dest: /var/lib/sparkring/images
    manifest: "{{ hostvars[groups['sparkring_head'][0]].export.manifest }}"
    rank: "{{ sparkring_rank }}"
    world_size: "{{ sparkring_world_size }}"
    ports: "{{ sparkring_ports }}"
"""

RETURN = r"""
manifest:
  description: Archive name, sha256, size, chunk size, per-chunk sha256s, image reference, image ID, image size.
  returned: state=exported, or check mode when the archive already exists
  type: dict
archive:
  description: Path of the verified archive on this rank.
  returned: always
  type: str
lacks:
  description: What this rank lacked before the run (C(archive), C(image)); empty means nothing moved.
  returned: state=present
  type: list
  elements: str
image_id:
  description: The image ID the reference resolves to on this rank after the run (null in check mode when absent).
  returned: state=present
  type: str
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

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError
from ansible.module_utils.sparkring_fanout import (
    DEFAULT_PORT,
    TRANSFER_OPTIONS,
    RankAgent,
    Stats,
    rank_config,
    transfer_result,
)
from ansible.module_utils.sparkring_fanout_manifest import (
    DEFAULT_CHUNK_SIZE,
    FanoutError,
    FileSet,
    Manifest,
    ManifestBuilder,
)
from ansible.module_utils.sparkring_fanout_store import check_space, final_state
from ansible.module_utils.sparkring_integrity import write_json_atomic


class ImageFanout:
    """One rank's view: what it holds, what it lacks, and the work to close the gap."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.dest = self.params["dest"]
        self.docker = Docker(module)
        self.zstd = module.get_bin_path("zstd", required=True)

    def exported(self) -> dict:
        """Rank 0: archive and manifest exist for the image the reference names now."""
        ref = self.params["image"]
        if not ref:
            self.module.fail_json(msg="state=exported needs image: the reference to export")
        current = self._image_id(ref)
        if current is None and self.module.check_mode:
            return {"changed": True, "archive": None, "msg": f"would export {ref} once it is built or pulled"}
        if current is None:
            self.module.fail_json(
                msg=f"image {ref} is not present on this rank; build or pull it first (image role)"
            )
        name = f"sparkring-image-{current.split(':')[-1][:16]}.tar.zst"
        path = os.path.join(self.dest, name)
        sidecar = path + ".manifest.json"
        if os.path.exists(sidecar):
            manifest = self._read_manifest(sidecar)
            if manifest.image_id == current and final_state(path, manifest) == "verified":
                return {"changed": False, "archive": path, "manifest": manifest.to_dict()}
        # The same stream either way: check mode hashes it and writes nothing, so the plan
        # below knows the archive's size and every rank's needs before anything is written.
        builder = ManifestBuilder(self.params["chunk_size"])
        partial = path + ".partial"
        out = None
        if not self.module.check_mode:
            os.makedirs(self.dest, exist_ok=True)
            out = open(partial, "wb")  # noqa: SIM115 (closed below, after fsync)

        def sink(block: bytes) -> None:
            builder.update(block)
            if out is not None:
                out.write(block)

        try:
            level = self.params["compression_level"]
            self.docker.pipe(
                [self.docker.binary, "save", ref], [self.zstd, f"-{level}", "-T0", "-q", "-c"], sink
            )
            size = self.docker.inspect(ref, kind="image")["Size"]
        except DockerError as error:
            self.module.fail_json(msg=f"exporting {ref}: {error}")
        finally:
            if out is not None:
                out.flush()
                os.fsync(out.fileno())
                out.close()
        manifest = builder.finish(name, image_ref=ref, image_id=current, image_bytes=size)
        if self.module.check_mode:
            return {
                "changed": True,
                "archive": path,
                "manifest": manifest.to_dict(),
                "msg": f"would export {path}",
            }
        os.replace(partial, path)
        write_json_atomic(sidecar, manifest.to_dict())
        return {"changed": True, "archive": path, "manifest": manifest.to_dict()}

    def present(self) -> dict:
        try:
            manifest = Manifest.from_dict(self.params["manifest"] or {})
        except (FanoutError, KeyError, TypeError) as error:
            self.module.fail_json(msg=f"manifest: {error}; pass the manifest state=exported returned")
        path = os.path.join(self.dest, manifest.name)
        rank = self.params["rank"]
        archive = final_state(path, manifest) if os.path.isdir(self.dest) else "absent"
        if archive == "different":
            self.module.fail_json(
                msg=f"rank {rank}: {path} exists and is not archive {manifest.sha256}; refusing to overwrite "
                "it: move it away or choose another dest",
                archive=path,
            )
        loaded = self._image_id(manifest.image_ref)
        has_image = loaded == manifest.image_id
        lacks = [name for name, ok in (("archive", archive == "verified"), ("image", has_image)) if not ok]
        before = {"archive": archive, "image_id": loaded}
        result = {
            "archive": path,
            "lacks": lacks,
            "image_id": loaded,
            **transfer_result(Stats()),
        }
        self._check_space(manifest, lacks)
        after = {"archive": "verified", "image_id": manifest.image_id if self.params["load"] else loaded}
        diff = {"diff": {"before": before, "after": after}} if self.module._diff else {}
        if self.module.check_mode:
            return {**result, "changed": bool(lacks), **diff}
        if self.params["transfer"]:
            result.update(self._transfer(manifest))
        if "image" in lacks and self.params["load"]:
            self._phase(manifest, "docker load")
            try:
                self.docker.pipe([self.zstd, "-dc", "-q", path], [self.docker.binary, "load", "-q"])
            except DockerError as error:
                self.module.fail_json(msg=f"rank {rank}: loading {path}: {error}", **result)
        if self.params["load"]:
            result["image_id"] = self._image_id(manifest.image_ref)
            if result["image_id"] != manifest.image_id:
                self.module.fail_json(
                    msg=f"rank {rank}: {manifest.image_ref} is {result['image_id']} after loading, the archive "
                    f"holds {manifest.image_id}; remove the stale tag and rerun",
                    **result,
                )
        changed = bool(lacks) or result["received_bytes"] > 0
        return {**result, "changed": changed, **diff}

    def _phase(self, manifest: Manifest, phase: str) -> None:
        """Tell whoever follows the progress file that the transfer is over and what runs now."""
        path = os.path.join(self.dest, manifest.name + ".progress.json")
        try:
            with open(path, encoding="utf-8") as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            state = {"rank": self.params["rank"], "chunks_total": len(manifest.chunks)}
        write_json_atomic(path, {**state, "phase": phase, "pid": os.getpid()})

    def _transfer(self, manifest: Manifest) -> dict:
        os.makedirs(self.dest, exist_ok=True)
        progress = os.path.join(self.dest, manifest.name + ".progress.json")
        config = rank_config(self.params, FileSet((manifest,)), self.dest, progress)
        try:
            return transfer_result(RankAgent(config).run())
        except (FanoutError, OSError) as error:
            self.module.fail_json(msg=f"rank {config.rank}: fan-out of {manifest.name} failed: {error}")

    def _check_space(self, manifest: Manifest, lacks: list[str]) -> None:
        """Before any byte moves: the archive fits in dest, the image fits in Docker's root."""
        reserve = self.params["reserve_bytes"]
        rank = self.params["rank"]
        try:
            if "archive" in lacks:
                probe = (
                    self.dest if os.path.isdir(self.dest) else os.path.dirname(self.dest.rstrip("/")) or "/"
                )
                check_space(probe, FileSet((manifest,)), reserve, rank)
            if "image" in lacks and self.params["load"]:
                docker_root = self.docker.run("info", "--format", "{{.DockerRootDir}}", check=True)[1].strip()
                stat = os.statvfs(docker_root)
                free = stat.f_bavail * stat.f_frsize
                if free - manifest.image_bytes < reserve:
                    raise FanoutError(
                        f"rank {rank}: Docker root {docker_root} has {free} bytes free; the image needs "
                        f"{manifest.image_bytes} and {reserve} must stay free; free space there"
                    )
        except (FanoutError, DockerError, OSError) as error:
            self.module.fail_json(msg=str(error), lacks=lacks)

    def _image_id(self, ref: str) -> str | None:
        try:
            image = self.docker.inspect(ref, kind="image")
        except DockerError as error:
            where = "" if self.params["rank"] is None else f"rank {self.params['rank']}: "
            self.module.fail_json(msg=f"{where}{error}; is this rank's Docker daemon running?")
        return image["Id"] if image else None

    def _read_manifest(self, path: str) -> Manifest:
        try:
            with open(path, encoding="utf-8") as handle:
                return Manifest.from_dict(json.load(handle))
        except (OSError, ValueError, FanoutError, TypeError) as error:
            self.module.fail_json(msg=f"{path}: unreadable manifest ({error}); remove it and rerun")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["exported", "present"], "default": "present"},
            "dest": {"type": "path", "required": True},
            "image": {"type": "str"},
            "chunk_size": {"type": "int", "default": DEFAULT_CHUNK_SIZE},
            "compression_level": {"type": "int", "default": 3},
            "manifest": {"type": "dict"},
            **TRANSFER_OPTIONS,
            "port": {"type": "int", "default": DEFAULT_PORT},
            "reserve_bytes": {"type": "int", "default": 1 << 30},
            "load": {"type": "bool", "default": True},
            **DOCKER_HOST_OPTION,
        },
        required_if=[
            ("state", "exported", ("image",)),
            ("state", "present", ("manifest", "rank", "world_size", "ports")),
        ],
        supports_check_mode=True,
    )
    fanout = ImageFanout(module)
    result = fanout.exported() if module.params["state"] == "exported" else fanout.present()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
