"""The launch plan for the example inventories, planned by ansible-playbook as `site.yml --check` plans it.

`site.yml --check` cannot run whole here: its stages ask real Sparks (ssh, Docker, devices). The stage
that refused the example ring was the launch plan: the `sparkring_rank_spec` filter, which renders
every rank's `docker run` from the launch profile, the inventory and the lock's overlay pins for the
inventory's image_flavor. These tests run the launch role the way playbooks/launch.yml does, with
--check and only a tagged task of their own after it: the role's tasks are skipped (no node is
contacted), its argument check and defaults (launch_profile_file) are the role's, image_flavor is
the inventory's, and the tagged task renders each rank's spec with the filter spec.yml calls, for a
Spark's devices (GPUs, RDMA, 20 CPUs) and a stand-in image reference.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from sparkring.lock import load_lock

from tests.project_code import run_json_play

ROOT = Path(__file__).resolve().parents[3]
PLAY = """\
- name: Plan the launch (the role's defaults and argument check, no task on a node)
  hosts: sparkring
  gather_facts: false
  roles:
    - role: launch
  post_tasks:
    - name: Render the rank's spec as spec.yml does
      ansible.builtin.debug:
        msg: >-
          {{ hostvars[inventory_hostname] | sparkring_rank_spec(
               hostvars[groups['sparkring_head'][0]], launch_profile_file,
               {'gpu': true, 'infiniband': true, 'cpu_count': 20}, 'sparkring/runtime:plan', image_flavor) }}
      tags: [plan]
"""


def plan(inventory: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """`ansible-playbook --check` of the launch plan against `inventory`: (rc, host -> spec or failure)."""
    rc, tasks = run_json_play(PLAY, inventory, tmp_path, "--check", "--tags", "plan")
    hosts: dict[str, Any] = {}
    for task in tasks:
        for host, outcome in task["hosts"].items():
            if outcome.get("failed") or task["task"]["name"] == "Render the rank's spec as spec.yml does":
                hosts[host] = outcome
    return rc, hosts


def test_the_example_ring_plans_the_upstream_image_with_its_overlay_pins(tmp_path: Path) -> None:
    rc, hosts = plan(ROOT / "inventories" / "example" / "ring4", tmp_path)
    assert rc == 0, hosts
    pins = load_lock().overlay_pins_for("upstream")
    assert sorted(hosts) == ["spark0", "spark1", "spark2", "spark3"]
    for host, outcome in hosts.items():
        spec = outcome["msg"]
        assert spec["rank"] == int(host[-1]) and spec["overlay_pins"] == pins.model_dump()
        assert "SPARKRING_OVERLAY_MODE=custom" in spec["argv"]
        assert "--gpus" in spec["argv"] and "--kv-cache-dtype" in spec["vllm_argv"]


def with_flavor(tmp_path: Path, flavor: str) -> Path:
    """The ring4 example with its image_flavor set to `flavor`."""
    inventory = tmp_path / "ring4"
    shutil.copytree(ROOT / "inventories" / "example" / "ring4", inventory)
    (inventory / "group_vars" / "sparkring" / "image.yml").write_text(f"image_flavor: {flavor}\n")
    return inventory


@pytest.mark.parametrize(
    ("flavor", "message"),
    [
        ("fork", "OVERLAY_MODE=custom: images/lock.json has no overlay pins for the fork runtime image"),
        ("gb10", "image_flavor: 'gb10' is not a runtime image flavor; expected one of upstream, fork, sim"),
    ],
)
def test_a_flavor_without_pins_or_unknown_is_refused_on_every_rank(
    tmp_path: Path, flavor: str, message: str
) -> None:
    rc, hosts = plan(with_flavor(tmp_path, flavor), tmp_path)
    assert rc != 0
    assert sorted(hosts) == ["spark0", "spark1", "spark2", "spark3"]
    for outcome in hosts.values():
        assert outcome["failed"] and "launch refused before anything was touched: " in outcome["msg"]
        assert message in outcome["msg"]
