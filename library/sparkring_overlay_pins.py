#!/usr/bin/python
"""Measure what the vLLM overlay would patch inside a runtime image (the lock's overlay pins)."""

# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_overlay_pins
short_description: Measure the vLLM overlay's patch targets inside a runtime image or a vLLM wheel
description:
  - Runs O(image) on this node in a throwaway container with no network
    (C(docker run --rm --network none --entrypoint python3 IMAGE -m overlay.pins measure)), which
    reports the installed vLLM version, what gave the image its vLLM (its build record's
    C(vllm_origin)), and for every patch of the overlay's wrappers for O(wrappers) the sha256 of the
    upstream file and the source of the target function. vLLM is found on disk, never imported.
  - Compares each target function with the source the wrapper was written for (O(reference)) and
    returns the unified diff per target (C(targets[].diff)), so that a person can judge whether each
    wrapper still fits; playbooks/overlay-pins.yml prints them. The module changes nothing, so it
    reports no Ansible diff (the lock's own diff is the write task's).
  - With O(wheel) instead, reads the same from a vLLM wheel file on this node
    (C(python -m overlay.pins measure --wheel WHEEL) with this module's Python, which must import the
    SparkRing overlay package, as the controller's project venv does); an image that installs that wheel holds
    exactly its files, so the upstream flavor is pinned from the wheel the lock names, before any image exists.
  - Returns C(pins), the entry for C(images/lock.json) C(overlay_pins); it writes nothing itself
    (playbooks/overlay-pins.yml writes the lock on the controller, after C(--check --diff) showed it).
  - Refuses, naming the patch and the file, an image that lacks a target file or function (the
    wrappers cannot be pinned to it), and an image whose build record has no C(vllm_origin).
version_added: "0.1.0"
author: SparkRing
options:
  image:
    description: The runtime image to measure (a reference the node's Docker resolves); or give O(wheel).
    type: str
  wheel:
    description: A vLLM wheel file on this node to measure instead of an image (its name and sha256 are the pins' C(image)).
    type: path
  wrappers:
    description: The vLLM release the overlay's wrappers were written against (C(overlay/registry.py)).
    type: str
    required: true
  reference:
    description:
      - The target functions as they are in vLLM O(wrappers), from C(overlay/upstream/vllm-<wrappers>.json)
        (C(vllm_version), and C(functions) keyed by file and qualified name).
    type: dict
    required: true
extends_documentation_fragment:
  - action_common_attributes
  - sparkring_docker
attributes:
  check_mode:
    support: full
    details: The measurement only reads (a throwaway container without network), so check mode runs it.
  diff_mode:
    support: none
    details: Nothing changes; each target's diff against its wrapper's source is in C(targets).
  platform:
    platforms: posix
requirements: [docker CLI on the node and the SparkRing overlay package inside the image, or the overlay package beside the module's Python for O(wheel)]
"""

EXAMPLES = r"""
- name: Measure the overlay's targets in the head's runtime image
  sparkring_overlay_pins:
    image: sparkring/runtime:sim-0123456789abcdef
    wrappers: "0.32.0"
    reference: "{{ lookup('ansible.builtin.file', 'overlay/upstream/vllm-0.32.0.json') | from_json }}"
  register: pins

- name: Measure them in the upstream flavor's vLLM wheel, on the controller
  sparkring_overlay_pins:
    wheel: /tmp/upstream-wheels/vllm-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl
    wrappers: "0.32.0"
    reference: "{{ lookup('ansible.builtin.file', 'overlay/upstream/vllm-0.32.0.json') | from_json }}"
  delegate_to: localhost
"""

RETURN = r"""
pins:
  description: The lock entry (C(overlay_pins.<flavor>)) for this image.
  returned: success
  type: dict
  contains:
    image: {description: What gave the image its vLLM (the fork's base by digest, a vLLM wheel by name and sha256)., type: str}
    vllm_version: {description: vLLM's version as importlib.metadata reports it in the image., type: str}
    wrappers: {description: The release the wrappers were written against., type: str}
    files: {description: sha256 of every patch target's file, by path under the vllm package's parent., type: dict}
targets:
  description: Every patch target, in registry order.
  returned: success
  type: list
  elements: dict
  contains:
    patch: {description: The patch name., type: str}
    file: {description: The upstream file., type: str}
    qualname: {description: The patched function., type: str}
    sha256: {description: sha256 of the file in the image., type: str}
    identical: {description: The function's source equals the one the wrapper was written for., type: bool}
    source: {description: The function's source in the image., type: str}
    diff: {description: Unified diff from the wrapper's source to this image's (empty when identical)., type: str}
"""

import difflib
import json
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_docker import DOCKER_HOST_OPTION, Docker, DockerError


def target_diff(target: dict, reference: str, wrappers: str, version: str) -> str:
    name = f"{target['file']}:{target['qualname']}"
    return "".join(
        difflib.unified_diff(
            reference.splitlines(keepends=True),
            target["source"].splitlines(keepends=True),
            fromfile=f"{name} (vLLM {wrappers}, written for)",
            tofile=f"{name} (vLLM {version}, this image)",
        )
    )


class PinMeasurer:
    """Runs the image once and turns its report into pins, sources and diffs."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.engine = Docker(module) if module.params["image"] else None

    def docker(self, *args: str) -> tuple[int, str, str]:
        return self.engine.run(*args)

    def measure(self) -> dict:
        if self.params["wheel"]:
            return self.measure_wheel()
        image, wrappers = self.params["image"], self.params["wrappers"]
        try:
            present = self.engine.inspect(image, kind="image") is not None
        except DockerError as error:
            self.module.fail_json(msg=f"image: {error}; is this node's Docker daemon running?")
        if not present:
            self.module.fail_json(
                msg=f"image: {image} is not on this node; run the image stage (playbooks/image.yml)"
            )
        rc, out, err = self.docker(
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "python3",
            image,
            "-m",
            "overlay.pins",
            "measure",
            "--wrappers",
            wrappers,
        )
        if rc != 0:
            self.module.fail_json(
                msg=f"image: measuring inside {image} failed (exit {rc}): {err.strip()[-1500:]}; does the image "
                f"carry the SparkRing overlay with wrappers for vLLM {wrappers}?"
            )
        return json.loads(out.strip().splitlines()[-1])

    def measure_wheel(self) -> dict:
        wheel, wrappers = self.params["wheel"], self.params["wrappers"]
        rc, out, err = self.module.run_command(
            [sys.executable, "-m", "overlay.pins", "measure", "--wrappers", wrappers, "--wheel", wheel],
            environ_update={"LANG": "C", "LC_ALL": "C"},
        )
        if rc != 0:
            self.module.fail_json(
                msg=f"wheel: measuring {wheel} failed (exit {rc}): {err.strip()[-1500:]}; is it a vLLM wheel, and "
                f"does {sys.executable} import the SparkRing overlay (run this on the controller, delegate_to: localhost)?"
            )
        return json.loads(out.strip().splitlines()[-1])

    def run(self) -> dict:
        image, wrappers = self.params["image"] or self.params["wheel"], self.params["wrappers"]
        reference = self.params["reference"]
        if reference.get("vllm_version") != wrappers or not isinstance(reference.get("functions"), dict):
            self.module.fail_json(
                msg=f"reference: expected the functions of vLLM {wrappers} (overlay/upstream/vllm-{wrappers}.json), "
                f"got vllm_version {reference.get('vllm_version')!r}"
            )
        measured = self.measure()
        version, origin = measured.get("vllm_version"), measured.get("vllm_origin")
        if not version:
            what = "wheel" if self.params["wheel"] else "image"
            self.module.fail_json(msg=f"{what}: {image} has no vLLM distribution; nothing to pin")
        if not origin:
            self.module.fail_json(
                msg=f"image: {image} has no vllm_origin in /opt/sparkring/image.json (it was built before overlay "
                "pins existed); rebuild it with playbooks/image.yml and pin again"
            )
        targets = []
        for target in measured["targets"]:
            where = f"patch {target['patch']!r} ({target['file']}:{target['qualname']})"
            if target["sha256"] is None or target["source"] is None:
                what = "no such file" if target["sha256"] is None else "no such function"
                self.module.fail_json(
                    msg=f"{where}: {what} in {image} (vLLM {version}); the wrappers for vLLM {wrappers} cannot "
                    "be pinned to it: run it with OVERLAY_MODE=disabled, or write wrappers for this vLLM"
                )
            written_for = reference["functions"].get(f"{target['file']}:{target['qualname']}")
            if written_for is None:
                self.module.fail_json(
                    msg=f"reference: overlay/upstream/vllm-{wrappers}.json lacks {where}; regenerate it where vLLM "
                    f"{wrappers} is installed (python -m overlay.pins reference --wrappers {wrappers})"
                )
            diff = target_diff(target, written_for, wrappers, version)
            targets.append({**target, "identical": not diff, "diff": diff, "written_for": written_for})
        result = {
            "changed": False,
            "pins": {
                "image": origin,
                "vllm_version": version,
                "wrappers": wrappers,
                "files": {t["file"]: t["sha256"] for t in targets},
            },
            "targets": [{k: v for k, v in t.items() if k != "written_for"} for t in targets],
        }
        return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str"},
            "wheel": {"type": "path"},
            "wrappers": {"type": "str", "required": True},
            "reference": {"type": "dict", "required": True},
            **DOCKER_HOST_OPTION,
        },
        required_one_of=[("image", "wheel")],
        mutually_exclusive=[("image", "wheel")],
        supports_check_mode=True,
    )
    module.exit_json(**PinMeasurer(module).run())


if __name__ == "__main__":
    main()
