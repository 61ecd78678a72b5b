#!/usr/bin/python
"""Ansible module: claim a new, empty evidence folder for one acceptance run (never reuse one)."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_evidence_folder
short_description: Claim a fresh, empty evidence folder for one run; an existing folder is never reused
description:
  - Creates I(root)/I(name) with an exclusive C(mkdir) (the kernel refuses a name that exists, so two
    runs can never share a folder, not even two started in the same second). When I(name) is taken,
    the next free C(<name>-2), C(<name>-3), ... up to C(<name>-99) is claimed instead, and the result
    says which existing folder was skipped. The existing folder is never opened, written or removed, so
    a stale gate JSON or a foreign file in it can never be mixed into this run's evidence.
  - Then creates I(subdirs) inside the claimed folder (only inside it).
  - Fails when I(root) cannot be created or written, or when all 99 names are taken, naming the folder
    and the fix.
version_added: "0.1.0"
author: SparkRing
options:
  root:
    description: The folder that holds one evidence folder per run (created with its parents if absent).
    type: path
    required: true
  name:
    description: The run's folder name (for example C(acceptance-20261206T194512Z)); a plain name, no C(/).
    type: str
    required: true
  subdirs:
    description: Folders to create inside the claimed folder.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Nothing is created; C(path) is the folder a real run would claim now.
  diff_mode:
    support: none
    details: A new folder has no previous state to compare.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Claim this run's evidence folder
  sparkring_evidence_folder:
    root: artifacts/sim
    name: acceptance-20261206T194512Z
    subdirs: [attestations, flight]
  register: evidence
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The claimed folder (created and empty but for I(subdirs); in check mode, the one a run would claim).
  returned: always
  type: str
skipped:
  description: Existing folders whose names were taken, in the order tried (never touched).
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

MAX_SUFFIX = 99


def candidates(name: str) -> list[str]:
    """The names tried in order: the run's own, then <name>-2 .. <name>-99."""
    return [name, *(f"{name}-{n}" for n in range(2, MAX_SUFFIX + 1))]


def claim(root: str, name: str, create: bool) -> tuple[str | None, list[str]]:
    """The first free candidate under ``root`` (made with an exclusive mkdir when ``create``), and
    the existing folders passed over; None when every name is taken."""
    skipped = []
    for candidate in candidates(name):
        path = os.path.join(root, candidate)
        if not create:
            if not os.path.lexists(path):
                return path, skipped
        else:
            try:
                os.mkdir(path, 0o755)
                return path, skipped
            except FileExistsError:
                pass
        skipped.append(path)
    return None, skipped


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "name": {"type": "str", "required": True},
            "subdirs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    root, name, subdirs = module.params["root"], module.params["name"], module.params["subdirs"]
    for field, value in [("name", name), *(("subdirs", s) for s in subdirs)]:
        if not value or "/" in value or value in (".", ".."):
            module.fail_json(msg=f"{field}: {value!r} is not a plain folder name; give a name without '/'")
    create = not module.check_mode
    if create:
        try:
            os.makedirs(root, mode=0o755, exist_ok=True)
        except OSError as exc:
            module.fail_json(
                msg=f"root: cannot create the evidence root {root} ({exc.strerror}); "
                "set acceptance_evidence_root to a folder the controller user can write"
            )
    try:
        path, skipped = claim(root, name, create)
    except OSError as exc:
        module.fail_json(
            msg=f"root: cannot create a folder in {root} ({exc.strerror}); "
            "set acceptance_evidence_root to a folder the controller user can write"
        )
    if path is None:
        module.fail_json(
            msg=f"name: {os.path.join(root, name)} and its {MAX_SUFFIX - 1} numbered successors all exist; "
            "an evidence folder is never reused: move the old ones away or set acceptance_evidence_root "
            "to another folder",
            skipped=skipped,
        )
    if create:
        for sub in subdirs:
            os.mkdir(os.path.join(path, sub), 0o755)
    module.exit_json(changed=create, path=path, skipped=skipped)


if __name__ == "__main__":
    main()
