#!/usr/bin/python
"""Resolve a runtime flavor's complete wheel set with pip, every wheel with its sha256 (the lock's `wheels`)."""

# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_wheel_lock
short_description: Resolve a runtime image's complete wheel set, each wheel with its sha256
description:
  - "Runs pip's resolver for I(requirements) as a runtime image of another platform would install them
    (C(pip install --dry-run --ignore-installed --report - --only-binary=:all:) with C(--platform) and
    C(--python-version))."
  - pip reads each candidate's metadata from the index (where it publishes it apart from the wheel, as PyPI
    does, no whole wheel is downloaded) and nothing is installed.
  - Returns C(wheel_set), the entry for C(images/lock.json) C(wheels.<flavor>), that is every wheel pip would install,
    by name, version, file name and the sha256 the index gives, marked C(complete). It writes nothing itself
    (playbooks/wheel-lock.yml writes the lock on the controller, after C(--check --diff) showed the change).
  - Run it where the index holds every wheel of the set (for the GB10 flavors, rank 0 of the cluster with
    the index it installs from); an index that lacks one fails with pip's own reason, naming the requirement.
  - Refuses, naming the wheel, a resolution that would install anything but a wheel with a sha256.
version_added: "0.1.0"
author: SparkRing
options:
  requirements:
    description: The requirements to resolve (the lock's C(wheels.<flavor>.requirements)), such as C(vllm==0.32.0).
    type: list
    elements: str
    required: true
  platform:
    description:
      - The newest manylinux tag the image's base runs (its glibc), such as C(manylinux_2_36_aarch64) for Debian 12.
      - Every older C(manylinux_2_Y) tag of that architecture, and the legacy aliases, are accepted too, as pip
        does for the platform it runs on.
    type: str
    required: true
  python_version:
    description: The image's Python, C(major.minor) (C(3.11) for Debian 12).
    type: str
    required: true
  python:
    description: The Python whose pip resolves; empty uses the Python that runs this module.
    type: path
    default: ""
  index_url:
    description: The index to resolve against (pip's C(--index-url)); empty keeps pip's configuration.
    type: str
    default: ""
  extra_index_urls:
    description: Further indexes (pip's C(--extra-index-url)).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: The resolution only reads from the index and installs nothing, so check mode runs it.
  diff_mode:
    support: none
    details: The playbook that writes the lock shows the diff (C(ansible.builtin.copy)).
  platform:
    platforms: posix
requirements: [pip 23.0 or newer beside I(python), and the index reachable]
"""

EXAMPLES = r"""
- name: Resolve the upstream flavor's wheel set on rank 0
  sparkring_wheel_lock:
    requirements: ["vllm==0.32.0", "torch==2.13.0", "wheel"]
    platform: manylinux_2_36_aarch64
    python_version: "3.11"
  register: resolved
"""

RETURN = r"""
wheel_set:
  description: The lock entry (C(wheels.<flavor>)) for this resolution.
  returned: success
  type: dict
  contains:
    platform: {description: The platform resolved for., type: str}
    python_version: {description: The Python resolved for., type: str}
    requirements: {description: The requirements resolved., type: list, elements: str}
    complete: {description: Always true, the set is pip's whole resolution., type: bool}
    wheels:
      description: Every wheel pip would install, sorted by name (C(name), C(version), C(file), C(sha256)).
      type: list
      elements: dict
pip_version:
  description: The version of the pip that resolved.
  returned: success
  type: str
"""

import json
import re
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_wheels import locked_wheel, platform_tags


class WheelResolver:
    """Runs pip's resolver once and turns its report into the lock's wheel set."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params

    def pip_argv(self) -> list[str]:
        params = self.params
        try:
            platforms = platform_tags(params["platform"])
        except ValueError:
            self.module.fail_json(
                msg=f"platform: {params['platform']!r} is not a manylinux_2_Y_<aarch64|x86_64> tag "
                "(the newest one the image's glibc runs, such as manylinux_2_36_aarch64 for Debian 12)"
            )
        if not re.fullmatch(r"3\.[0-9]+", params["python_version"]):
            self.module.fail_json(
                msg=f"python_version: {params['python_version']!r}, expected major.minor such as 3.11"
            )
        argv = [params["python"] or sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        argv += [
            "--quiet",
            "--report",
            "-",
            "--only-binary=:all:",
            "--python-version",
            params["python_version"],
        ]
        for platform in platforms:
            argv += ["--platform", platform]
        if params["index_url"]:
            argv += ["--index-url", params["index_url"]]
        for url in params["extra_index_urls"]:
            argv += ["--extra-index-url", url]
        return [*argv, "--", *params["requirements"]]

    def run(self) -> dict:
        requirements = self.params["requirements"]
        if not requirements:
            self.module.fail_json(
                msg="requirements: empty; name what the image installs (the lock's wheels.<flavor>.requirements)"
            )
        rc, out, err = self.module.run_command(
            self.pip_argv(),
            environ_update={"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"},
        )
        if rc != 0:
            errors = [line for line in err.splitlines() if "ERROR" in line] or err.strip().splitlines()[-5:]
            self.module.fail_json(
                msg=f"requirements: pip could not resolve {requirements} for {self.params['platform']} and Python "
                f"{self.params['python_version']}: {' '.join(errors)[-2000:]}; an index without a wheel of the set for "
                "this platform cannot resolve it: run this where the cluster installs from (rank 0, playbooks/wheel-lock.yml)"
            )
        try:
            report = json.loads(out)
            items = list(report["install"])
        except (ValueError, KeyError, TypeError) as error:
            self.module.fail_json(
                msg=f"python: its pip wrote no installation report ({error!r}); pip 23.0 or newer is needed"
            )
        try:
            wheels = sorted((locked_wheel(item) for item in items), key=lambda w: w["name"].lower())
        except ValueError as error:
            self.module.fail_json(msg=f"requirements: {error}")
        return {
            "changed": False,
            "pip_version": report.get("pip_version", ""),
            "wheel_set": {
                "platform": self.params["platform"],
                "python_version": self.params["python_version"],
                "requirements": list(requirements),
                "complete": True,
                "wheels": wheels,
            },
        }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "requirements": {"type": "list", "elements": "str", "required": True},
            "platform": {"type": "str", "required": True},
            "python_version": {"type": "str", "required": True},
            "python": {"type": "path", "default": ""},
            "index_url": {"type": "str", "default": ""},
            "extra_index_urls": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    module.exit_json(**WheelResolver(module).run())


if __name__ == "__main__":
    main()
