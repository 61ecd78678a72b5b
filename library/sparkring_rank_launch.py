#!/usr/bin/python
"""Attest, start, roll back and stop one rank's SparkRing container (docs/design.md §3.5)."""

# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_rank_launch
short_description: Attest, start, roll back or stop one rank's vLLM container
description:
  - Runs on one rank with the spec that C(sparkring_rank_spec) rendered on the controller (the exact
    C(docker run) argv, env, mounts, labels). Nothing here re-renders or edits the argv.
  - O(state=attested) writes the rank's attestation record (image ID, sha256 of the NCCL library and of
    the transport, overlay and SparkCache packages as found INSIDE the image, mounts with the sha256 of
    read-only files and the manifest digest of each model directory, environment with secrets redacted,
    full argv, profile hash) under O(attest_dir) and returns it.
  - A model directory's digest is the one the model stage verified (full sha256 of every file, kept in
    its record beside the directory); it counts only while every file is the very file verified (stat
    stamp unchanged) and the directory holds nothing else, and the record's files must be the lock's
    pin for that model (O(models)). Otherwise the rank refuses to attest, naming the files.
  - When the spec runs with C(--gpus), O(state=attested) first refuses a GPU that a process outside this
    cluster's containers (label C(sparkring.cluster)) holds, naming the rank and every such process
    (C(nvidia-smi --query-compute-apps)); a previous launch's own containers do not count, since the
    launch replaces them.
  - When the spec carries C(overlay_pins) (the overlay is on), O(state=attested) refuses an image whose
    vLLM version, pinned vLLM files (hashed inside the image) or built-in pins differ from the lock's
    overlay pins for it, naming the file, both hashes, the rank and the fix (the overlay would stop
    vLLM at start otherwise, after the running containers were stopped).
  - Both refusals also run in check mode, where they only read (C(nvidia-smi), and, when the image is
    already on the rank, the image ID and a throwaway C(docker run --rm --network none) in it).
  - O(state=started) first compares the records of all ranks (O(attestations)); any field that is not
    rank-specific and differs fails the module naming the field and the ranks, before anything changes.
    It then keeps the previous container (stopped, renamed C(<name>-previous)) and runs the new one.
    A rank whose container already runs this exact argv is left alone unless O(force).
  - O(state=rolledback) removes the new container and restarts C(<name>-previous) under its old name.
  - O(state=stopped) stops the rank's container (bounded); O(state=absent) removes it and the previous one.
version_added: "0.1.0"
author: SparkRing
options:
  state:
    description: What to do on this rank.
    type: str
    choices: [attested, started, rolledback, stopped, absent]
    required: true
  spec:
    description:
      - The rank's spec from the C(sparkring_rank_spec) filter (C(rank), C(container_name), C(image),
        C(argv), C(env), C(mounts), C(labels), C(secret_env_names)). Required for O(state=attested) and
        O(state=started); for the other states only C(container_name) is read.
    type: dict
    required: true
  attestations:
    description: Every rank's record from O(state=attested) (O(state=started) only).
    type: list
    elements: dict
    default: []
  models:
    description:
      - The models the profile serves as the C(sparkring_model_pins) filter pins them, each with C(name),
        C(revision), C(path) and C(files) (each C(path), C(size), C(sha256)). Every read-only directory
        mount must be one of these paths.
    type: list
    elements: dict
    default: []
  expected_image_id:
    description: When set, the local image ID of C(spec.image) must equal it (the image stage's identity).
    type: str
    default: ""
  force:
    description: Replace the container even when it already runs this argv (a four-process replacement).
    type: bool
    default: false
  failed_container_id:
    description:
      - Set by a launch's rescue to the container it started on this rank (empty when it started none).
        Then O(state=rolledback) acts only when that container holds the name; it is removed even
        without a previous one to restore, and its last 300 log lines are kept in
        O(state_dir)/<name>-failed.log. Unset (a plain rollback), the previous container replaces
        whatever holds the name.
    type: str
  secrets:
    description:
      - Values for the names in C(spec.secret_env_names), handed to C(docker run) through its own
        environment only (the argv carries the names). Never written, never returned.
    type: dict
    default: {}
  attest_dir:
    description: Where attestation records are written on the rank.
    type: path
    default: /var/lib/sparkring/attestations
  state_dir:
    description: Where the rank remembers which container it started with which argv.
    type: path
    default: /var/lib/sparkring/launch
  nccl_path:
    description:
      - The NCCL library inside the image that the attestation hashes. Empty means the path the
        image's own C(/opt/sparkring/image.json) records (none in the sim image, which has no NCCL).
    type: str
    default: ""
  packages:
    description: Python packages inside the image whose installed trees the attestation hashes.
    type: list
    elements: str
    default: [transport, overlay, sparkcache]
  stop_timeout:
    description: Seconds C(docker stop) gives vLLM to exit after SIGTERM before SIGKILL.
    type: int
    default: 30
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
attributes:
  check_mode:
    support: full
    details:
      - Nothing is written, stopped or renamed. O(state=attested) still refuses an occupied GPU and, where
        the image is already present, a wrong image ID or an image that does not match the overlay pins
        (a throwaway container with no network reads it); it builds the record and reports C(changed)
        exactly when the real run would write a new one (always when the image or a model mount is not
        in place yet, which the image and model stages of the same run bring).
  diff_mode:
    support: full
    details: The argv the rank runs now (before) and the argv it would run (after), one token per line.
  platform:
    platforms: posix
requirements: [docker CLI on the rank, python3 inside the image]
"""

EXAMPLES = r"""
- name: Attest this rank
  sparkring_rank_launch:
    state: attested
    spec: "{{ launch_spec }}"
  register: launch_attest

- name: Start (refuses unless all ranks' records agree)
  sparkring_rank_launch:
    state: started
    spec: "{{ launch_spec }}"
    attestations: "{{ groups['sparkring'] | map('extract', hostvars, ['launch_attest', 'record']) | list }}"
    secrets: {HF_TOKEN: "{{ lookup('ansible.builtin.env', 'HF_TOKEN') }}"}

- name: Put the previous deployment back
  sparkring_rank_launch:
    state: rolledback
    spec: {container_name: sparkring-rank0}
"""

RETURN = r"""
record:
  description: The attestation record (O(state=attested)); secrets appear as names or C(<redacted>) only.
  returned: state=attested and not check mode
  type: dict
record_path:
  description: Where the record was written.
  returned: state=attested and not check mode
  type: str
record_sha256:
  description: sha256 of the canonical record.
  returned: state=attested and not check mode
  type: str
up_to_date:
  description: The rank's container already runs this exact argv (a launch would change nothing here).
  returned: state=attested
  type: bool
container_id:
  description: The container now holding C(spec.container_name) (empty when none).
  returned: always
  type: str
previous_container_id:
  description: The container kept as C(<name>-previous) (empty when none).
  returned: state=started
  type: str
restored:
  description: Whether a previous container was put back and started.
  returned: state=rolledback
  type: bool
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_attest import (
    IMAGE_PROBE,
    SCHEMA,
    digest,
    disagreements,
    redact_argv,
)
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError
from ansible.module_utils.sparkring_gpu import (
    COMPUTE_APPS_ARGS,
    GpuQueryError,
    describe,
    foreign_processes,
    parse_compute_apps,
)
from ansible.module_utils.sparkring_integrity import redact_env, write_json_atomic
from ansible.module_utils.sparkring_model import layout, record_problems

SHOWN_PROBLEMS = 12


class RankLauncher:
    """One rank's container lifecycle; every docker call goes through `docker()` (module_utils/sparkring_docker)."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.spec = module.params["spec"]
        self.name = self.spec.get("container_name") or module.fail_json(
            msg="spec.container_name: missing (pass the output of the sparkring_rank_spec filter)"
        )
        self.previous = f"{self.name}-previous"
        self.engine = Docker(module)
        self.state_path = os.path.join(module.params["state_dir"], f"{self.name}.json")

    # -- docker ---------------------------------------------------------------------------------
    def docker(self, *args: str, check: bool = True, env: dict | None = None) -> tuple[int, str, str]:
        rc, out, err = self.engine.run(*args, env=env)
        if check and rc != 0:
            self.module.fail_json(
                msg=f"rank {self.spec.get('rank')}: docker {args[0]} {self.name}: {err.strip() or out.strip()}",
                rc=rc,
            )
        return rc, out, err

    def inspect(self, name: str) -> dict | None:
        try:
            return self.engine.inspect(name)
        except DockerError as error:
            self.module.fail_json(
                msg=f"rank {self.spec.get('rank')}: {error}; is this rank's Docker daemon running?"
            )

    def running(self, container: dict | None) -> bool:
        return bool(container and container["State"]["Running"])

    # -- files ----------------------------------------------------------------------------------
    def write_json(self, path: str, value: dict) -> bool:
        """Atomic, durable write; False when the file already holds exactly this content.

        In check mode nothing is written: True says the file would change."""
        data = json.dumps(value, indent=1, sort_keys=True) + "\n"
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == data:
                    return False
        except OSError:
            pass
        if self.module.check_mode:
            return True
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
        write_json_atomic(path, value)
        os.chmod(path, 0o640)
        return True

    def launch_state(self) -> dict:
        try:
            with open(self.state_path, encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return {}

    def up_to_date(self) -> bool:
        """The container under our name is the one we started, running, with this exact argv."""
        state, current = self.launch_state(), self.inspect(self.name)
        return bool(
            current
            and self.running(current)
            and state.get("container_id") == current["Id"]
            and state.get("argv_sha256") == digest(self.spec.get("argv"))
        )

    def diff(self) -> dict:
        before = self.launch_state().get("argv") if self.inspect(self.name) else None
        return {
            "before_header": f"{self.name} (running now)",
            "after_header": f"{self.name} (rank {self.spec.get('rank')}, this launch)",
            "before": "\n".join(redact_argv(before)) + "\n" if before else "",
            "after": "\n".join(redact_argv(self.spec["argv"])) + "\n",
        }

    # -- attestation ----------------------------------------------------------------------------
    def refuse_occupied_gpu(self) -> None:
        """Fail, naming the rank and the processes, when anything but our containers holds the GPU."""
        if "--gpus" not in self.spec["argv"]:
            return
        rank = self.spec["rank"]
        smi = self.module.get_bin_path("nvidia-smi")
        if not smi:
            self.module.fail_json(
                msg=f"gpu: rank {rank} runs with --gpus but has no nvidia-smi, so nobody can tell whether "
                "its GPU is free; install the NVIDIA driver utilities on the rank"
            )
        rc, out, err = self.module.run_command(
            [smi, *COMPUTE_APPS_ARGS], environ_update={"LANG": "C", "LC_ALL": "C"}
        )
        try:
            if rc != 0:
                raise GpuQueryError(f"nvidia-smi exited {rc}: {(err or out).strip()[:300]}")
            processes = parse_compute_apps(out)
        except GpuQueryError as exc:
            self.module.fail_json(msg=f"gpu: rank {rank}: cannot tell whether the GPU is free: {exc}")
        cluster = self.spec["labels"].get("sparkring.cluster", "")
        _rc, listed, _err = self.docker(
            "ps", "--all", "--quiet", "--no-trunc", "--filter", f"label=sparkring.cluster={cluster}"
        )
        ours = set(listed.split())
        foreign = foreign_processes(processes, ours.__contains__)
        if foreign:
            self.module.fail_json(
                msg=f"gpu: the GPU of rank {rank} is held by {describe(foreign)}, which are not this "
                f"cluster's containers: vLLM would run out of memory at model load on rank {rank}. Stop "
                "them (nvidia-smi lists them) and launch again",
                holders=[{"pid": p.pid, "name": p.name, "used_memory": p.used_memory} for p in foreign],
            )

    def image_identity(self) -> dict:
        rc, out, err = self.docker("image", "inspect", self.spec["image"], check=False)
        if rc != 0:
            self.module.fail_json(
                msg=f"image: {self.spec['image']} is not present on rank {self.spec['rank']} "
                f"({err.strip()}); run the image stage (playbooks/image.yml) first"
            )
        image = json.loads(out)[0]
        expected = self.params["expected_image_id"]
        if expected and image["Id"] != expected:
            self.module.fail_json(
                msg=f"image: {self.spec['image']} on rank {self.spec['rank']} is {image['Id']}, the image "
                f"stage recorded {expected}; re-run the fan-out (playbooks/image.yml)"
            )
        return {"reference": self.spec["image"], "id": image["Id"]}

    def image_present(self) -> bool:
        return self.docker("image", "inspect", self.spec["image"], check=False)[0] == 0

    def image_files(self) -> dict:
        """Hash the NCCL library, the packages and the pinned vLLM files inside the image, in a
        throwaway container."""
        args = ["run", "--rm", "--network", "none", "--workdir", "/opt/sparkring", "--entrypoint", "python3"]
        args += [self.spec["image"]]
        args += ["-c", IMAGE_PROBE, self.params["nccl_path"], *self.params["packages"]]
        pins = self.spec.get("overlay_pins")
        if pins:
            args += ["--vllm", *sorted(pins["files"])]
        rc, out, err = self.docker(*args, check=False)
        if rc != 0:
            self.module.fail_json(
                msg=f"image_files: hashing inside {self.spec['image']} failed on rank {self.spec['rank']}: "
                f"{err.strip()[-2000:]}"
            )
        probe = json.loads(out.strip().splitlines()[-1])
        probe.pop("python")
        return probe

    def refuse_unpinned_image(self, probe: dict) -> None:
        """Fail when the image is not the one the lock's overlay pins describe (the overlay on)."""
        pins = self.spec.get("overlay_pins")
        if not pins:
            return
        vllm = probe.get("vllm") or {}
        problems = []
        if vllm.get("version") != pins["vllm_version"]:
            problems.append(f"it has vLLM {vllm.get('version')}, pinned {pins['vllm_version']}")
        for name, expected in sorted(pins["files"].items()):
            found = (vllm.get("files") or {}).get(name)
            if found != expected:
                problems.append(f"{name} has sha256 {found or '<missing>'}, pinned {expected}")
        if not problems and vllm.get("image_json_overlay_pins") != pins:
            problems.append(
                "its build record (/opt/sparkring/image.json) carries other overlay pins than the lock "
                "(the image was built before the last pinning)"
            )
        if problems:
            self.module.fail_json(
                msg=f"overlay pins: image {self.spec['image']} on rank {self.spec['rank']} does not match "
                f"images/lock.json overlay_pins ({pins['image']}): " + "; ".join(problems) + ". The overlay "
                "would stop vLLM at start. Rebuild the image from the lock (playbooks/image.yml); if this vLLM "
                "is the one you want, pin it (playbooks/overlay-pins.yml --check --diff, then without --check)",
                problems=problems,
            )

    def mount_manifest(self, source: str, target: str) -> tuple[str | None, str | None]:
        """A read-only mount's content digest: a file's sha256, or the manifest digest the model stage
        verified for a model directory (every file's full sha256, trusted while its stamp holds); or,
        instead of a digest, why the mount cannot be attested and what to run."""
        rank = self.spec["rank"]
        if not os.path.exists(source):
            return None, (
                f"mounts: {source} (for {target}) does not exist on rank {rank}; put it there first (the model stage, "
                "or the build stage's overlay role for the ring spec)"
            )
        if os.path.isfile(source):
            return self.module.sha256(source), None
        models = {os.path.normpath(model["path"]): model for model in self.params["models"]}
        model = models.get(os.path.normpath(source))
        if model is None:
            return None, (
                f"mounts: {source} is a read-only directory on rank {rank} that no pinned model describes; "
                "only the profile's MODEL_PATH/DRAFT_PATH are mounted read-only (models from sparkring_model_pins)"
            )
        manifest, problems = record_problems(layout(source), model["files"])
        if problems:
            shown = "; ".join(problems[:SHOWN_PROBLEMS])
            return None, (
                f"mounts: {source} on rank {rank} is not the verified {model['name']} {model['revision']} "
                f"({shown}); run the model stage (playbooks/model.yml), which re-sends what differs"
            )
        return manifest, None

    def mounts(self) -> list[dict] | None:
        """Every mount with its content digest; None in check mode when a read-only mount is not yet in
        place (the model stage of the same run would bring it), a failure naming it otherwise."""
        described = []
        for mount in self.spec["mounts"]:
            if not mount["read_only"]:
                if os.path.exists(
                    mount["source"]
                ):  # a writable cache directory docker creates on first start
                    described.append({**mount, "manifest_sha256": None})
                continue
            manifest, problem = self.mount_manifest(mount["source"], mount["target"])
            if problem and self.module.check_mode:
                return None
            if problem:
                self.module.fail_json(msg=problem)
            described.append({**mount, "manifest_sha256": manifest})
        return described

    def attest(self) -> dict:
        self.refuse_occupied_gpu()
        result: dict = {"changed": False, "up_to_date": self.up_to_date()}
        if self.module.check_mode and not self.image_present():
            # The image stage has yet to bring the image: its record is written once it has.
            result["changed"] = True
            return result
        spec = self.spec
        image = self.image_identity()
        image_files = self.image_files()
        self.refuse_unpinned_image(image_files)
        mounts = self.mounts()
        if mounts is None:
            result["changed"] = True  # check mode: a model the model stage has yet to bring
            return result
        record = {
            "schema": SCHEMA,
            "rank": spec["rank"],
            "container_name": self.name,
            "image": image,
            "image_files": image_files,
            "mounts": mounts,
            "env": redact_env(spec["env"]),
            "labels": spec["labels"],
            "secret_env_names": sorted(spec["secret_env_names"]),
            "argv": redact_argv(spec["argv"]),
            "profile_sha256": spec["labels"].get("sparkring.profile_sha256"),
        }
        record_sha = digest(record)
        path = os.path.join(self.params["attest_dir"], f"{self.name}-{record_sha[:16]}.json")
        result["changed"] = self.write_json(path, record)
        latest = os.path.join(self.params["attest_dir"], f"{self.name}-latest.json")
        self.write_json(latest, record)
        result.update(record=record, record_path=path, record_sha256=record_sha)
        return result

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> dict:
        # Check mode attests nothing (no in-image hashing), so there is nothing to compare yet.
        planning = self.module.check_mode and not self.params["attestations"]
        problems = [] if planning else disagreements(self.params["attestations"])
        if problems:
            shown = problems[:SHOWN_PROBLEMS]
            if len(problems) > SHOWN_PROBLEMS:
                shown.append(f"... and {len(problems) - SHOWN_PROBLEMS} more")
            self.module.fail_json(
                msg="attestation: the ranks disagree, no rank starts:\n" + "\n".join(shown), problems=problems
            )
        own = [r for r in self.params["attestations"] if r["rank"] == self.spec["rank"]]
        if not self.module.check_mode and (len(own) != 1 or own[0]["argv"] != redact_argv(self.spec["argv"])):
            self.module.fail_json(
                msg=f"attestation: rank {self.spec['rank']} has no record for this exact argv; "
                "attest (state=attested) with the same spec first"
            )
        unknown = sorted(set(self.params["secrets"]) - set(self.spec["secret_env_names"]))
        if unknown:
            self.module.fail_json(msg=f"secrets: {unknown} are not in spec.secret_env_names; refusing")
        result: dict = {"changed": False, "diff": self.diff()}
        if self.up_to_date() and not self.params["force"]:
            result["container_id"] = self.inspect(self.name)["Id"]
            return result
        result["changed"] = True
        if self.module.check_mode:
            return result
        previous = self.inspect(self.previous)
        if previous:
            self.docker("rm", "--force", self.previous)
        current = self.inspect(self.name)
        if current:
            self.docker("stop", "--time", str(self.params["stop_timeout"]), self.name)
            self.docker("rename", self.name, self.previous)
        secret_env = {key: value for key, value in self.params["secrets"].items() if value}
        rc, out, err = self.docker(*self.spec["argv"][1:], env=secret_env, check=False)
        if rc != 0:
            # Nothing new runs here: put the previous container back before failing.
            self.docker("rm", "--force", self.name, check=False)
            if current:
                self.docker("rename", self.previous, self.name)
                self.docker("start", self.name)
            self.module.fail_json(
                msg=f"rank {self.spec['rank']}: docker run {self.name} failed ({err.strip()[-1500:]}); "
                + ("the previous container runs again" if current else "nothing was started"),
                rc=rc,
            )
        container_id = out.strip().splitlines()[-1]
        old = self.launch_state()
        self.write_json(
            self.state_path,
            {
                "container_id": container_id,
                "argv_sha256": digest(self.spec["argv"]),
                "argv": redact_argv(self.spec["argv"]),
                "previous": {
                    "container_id": current["Id"],
                    **{k: old.get(k) for k in ("argv_sha256", "argv")},
                }
                if current
                else None,
            },
        )
        result.update(container_id=container_id, previous_container_id=current["Id"] if current else "")
        return result

    def rollback(self) -> dict:
        result: dict = {"changed": False, "restored": False}
        previous, current = self.inspect(self.previous), self.inspect(self.name)
        failed = self.params["failed_container_id"]
        # A launch's rescue acts only on the container it started; a plain rollback only when
        # there is a previous deployment to go back to. Otherwise whatever runs here stays.
        ours = failed is not None and bool(current) and current["Id"] == failed
        if not (ours or (failed is None and previous)):
            result["container_id"] = current["Id"] if current else ""
            return result
        remove = bool(current)
        result["changed"] = True
        if self.module.check_mode:
            return result
        if remove:
            # Keep the failed container's last words for the post-mortem before it goes.
            _rc, out, err = self.docker("logs", "--tail", "300", self.name, check=False)
            os.makedirs(self.params["state_dir"], mode=0o750, exist_ok=True)
            with open(os.path.join(self.params["state_dir"], f"{self.name}-failed.log"), "w") as handle:
                handle.write(out + err)
            self.docker("rm", "--force", self.name)
        if previous:
            self.docker("rename", self.previous, self.name)
            self.docker("start", self.name)
            state = self.launch_state().get("previous") or {}
            self.write_json(self.state_path, {**state, "container_id": previous["Id"], "previous": None})
            result["restored"] = True
        result["container_id"] = previous["Id"] if previous else ""
        return result

    def stop(self) -> dict:
        current = self.inspect(self.name)
        if not self.running(current):
            return {"changed": False, "container_id": current["Id"] if current else ""}
        if not self.module.check_mode:
            self.docker("stop", "--time", str(self.params["stop_timeout"]), self.name)
        return {"changed": True, "container_id": current["Id"]}

    def remove(self) -> dict:
        present = [name for name in (self.name, self.previous) if self.inspect(name)]
        if present and not self.module.check_mode:
            for name in present:
                self.docker("rm", "--force", name)
            if os.path.exists(self.state_path):
                os.unlink(self.state_path)
        return {"changed": bool(present), "container_id": ""}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {
                "type": "str",
                "required": True,
                "choices": ["attested", "started", "rolledback", "stopped", "absent"],
            },
            "spec": {"type": "dict", "required": True},
            "attestations": {"type": "list", "elements": "dict", "default": []},
            "models": {"type": "list", "elements": "dict", "default": []},
            "expected_image_id": {"type": "str", "default": ""},
            "force": {"type": "bool", "default": False},
            "failed_container_id": {"type": "str"},
            "secrets": {"type": "dict", "default": {}, "no_log": True},
            "attest_dir": {"type": "path", "default": "/var/lib/sparkring/attestations"},
            "state_dir": {"type": "path", "default": "/var/lib/sparkring/launch"},
            "nccl_path": {"type": "str", "default": ""},
            "packages": {
                "type": "list",
                "elements": "str",
                "default": ["transport", "overlay", "sparkcache"],
            },
            "stop_timeout": {"type": "int", "default": 30},
            **DOCKER_HOST_OPTION,
        },
        supports_check_mode=True,
    )
    state = module.params["state"]
    if state in ("attested", "started"):
        missing = [
            key
            for key in ("rank", "image", "argv", "env", "mounts", "labels", "secret_env_names")
            if key not in module.params["spec"]
        ]
        if missing:
            module.fail_json(
                msg=f"spec: missing {missing}; pass the output of the sparkring_rank_spec filter"
            )
    launcher = RankLauncher(module)
    action = {
        "attested": launcher.attest,
        "started": launcher.start,
        "rolledback": launcher.rollback,
        "stopped": launcher.stop,
        "absent": launcher.remove,
    }[state]
    result = action()
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
