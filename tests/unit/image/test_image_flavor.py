"""The inventory's image_flavor, checked by the image role's argument spec before any task reaches a node.

The play runs the role the way playbooks/image.yml does, with --check and only a tagged task of its
own: the role's tasks are skipped (no node is contacted); its argument check runs on every host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.project_code import ROOT, run_json_play

PLAY = """\
- name: Check the image role's arguments (no task on a node)
  hosts: sparkring_head
  gather_facts: false
  roles:
    - role: image
  post_tasks:
    - name: Show the flavor
      ansible.builtin.debug:
        var: image_flavor
      tags: [plan]
"""


def check(tmp_path: Path, flavor: str | None) -> tuple[int, list[dict]]:
    """The example ring4 inventory with `flavor` (None: no image_flavor at all): (rc, spark0's outcomes)."""
    inventory = tmp_path / "ring4"
    shutil.copytree(ROOT / "inventories" / "example" / "ring4", inventory)
    image_vars = inventory / "group_vars" / "sparkring" / "image.yml"
    if flavor is None:
        image_vars.unlink()
    elif flavor != "upstream":
        image_vars.write_text(f"image_flavor: {flavor}\n")
    rc, tasks = run_json_play(PLAY, inventory, tmp_path, "--check", "--tags", "plan")
    return rc, [task["hosts"]["spark0"] for task in tasks if "spark0" in task["hosts"]]


def test_the_example_inventory_chooses_upstream(tmp_path: Path) -> None:
    rc, outcomes = check(tmp_path, "upstream")
    assert rc == 0 and outcomes[-1]["image_flavor"] == "upstream"


@pytest.mark.parametrize(
    ("flavor", "message"),
    [
        ("gb10", "value of image_flavor must be one of: upstream, fork, sim, got: gb10"),
        (None, "missing required arguments: image_flavor"),
    ],
)
def test_another_or_no_flavor_is_refused_naming_the_field(
    tmp_path: Path, flavor: str | None, message: str
) -> None:
    rc, outcomes = check(tmp_path, flavor)
    assert rc != 0
    assert outcomes[-1]["failed"] and message in outcomes[-1]["msg"]
