"""Which models preflight checks, planned by the real role against each checked-in inventory.

`preflight_models` is a role default (the launch profile joined with the lock through the
inventory's model_target/model_draft), and the role's argument check templates it on every rank
before any task reaches a node. So these tests run the role the way `playbooks/preflight.yml` does,
through `ansible-playbook`, with only a tagged task of their own after it: the role's tasks are
skipped (no node is contacted) and its argument check and defaults are exactly the role's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from sparkring.lock import load_lock
from sparkring.models import model_pins
from sparkring.profile import load_profile_file

from tests.project_code import run_json_play

ROOT = Path(__file__).resolve().parents[3]
PLAY = """\
- name: Plan the preflight (the role's defaults and argument check, no task on a node)
  hosts: sparkring
  gather_facts: false
  roles:
    - role: preflight
  post_tasks:
    - name: Show the planned models
      ansible.builtin.debug:
        var: preflight_models
      tags: [plan]
"""


def plan(inventory: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """Run the preflight role's plan against `inventory`: (rc, host -> the plan task or the failure)."""
    rc, tasks = run_json_play(PLAY, inventory, tmp_path, "--tags", "plan")
    hosts: dict[str, Any] = {}
    for task in tasks:
        for host, outcome in task["hosts"].items():
            if outcome.get("failed") or "preflight_models" in outcome:
                hosts[host] = outcome
    return rc, hosts


@pytest.mark.parametrize("name", ["example/ring4", "example/pair"])
def test_an_inventory_that_names_no_model_plans_no_model_checks(name, tmp_path):
    rc, hosts = plan(ROOT / "inventories" / name, tmp_path)
    assert rc == 0, hosts
    assert len(hosts) in (2, 4)
    assert all(outcome["preflight_models"] == [] for outcome in hosts.values())


@pytest.mark.parametrize("name", ["sim", "sim-pair"])
def test_the_sim_inventories_plan_the_pinned_sim_model_on_every_rank(name, tmp_path):
    inventory = ROOT / "inventories" / name
    rc, hosts = plan(inventory, tmp_path)
    assert rc == 0, hosts
    pins = model_pins(load_profile_file(inventory / "launch.env"), load_lock(), "sim-target", "")
    assert [pin["name"] for pin in pins] == ["sim-target"]
    assert len(hosts) in (2, 4)
    for outcome in hosts.values():
        assert outcome["preflight_models"] == pins


def test_a_named_model_the_lock_does_not_pin_is_refused_on_every_rank(tmp_path):
    """The ring4 example once its operator names the model but has not pinned it in the lock yet."""
    inventory = tmp_path / "ring4"
    shutil.copytree(ROOT / "inventories" / "example" / "ring4", inventory)
    (inventory / "group_vars" / "sparkring").mkdir(parents=True, exist_ok=True)
    (inventory / "group_vars" / "sparkring" / "model.yml").write_text("model_target: glm-5.3-flash\n")
    rc, hosts = plan(inventory, tmp_path)
    assert rc != 0
    assert sorted(hosts) == ["spark0", "spark1", "spark2", "spark3"]
    for outcome in hosts.values():
        assert outcome["failed"] and "preflight_models" not in outcome
        assert "model_target: 'glm-5.3-flash' is not among the" in outcome["msg"]
        assert "pin it there (repository, revision and every file)" in outcome["msg"]
