"""Golden hostvars for the checked-in inventories, through the real `ansible-inventory` CLI.

The golden files (golden/<name>.json: groups and hostvars) are the contract later stages read;
a change to them is a change of that contract, to be reviewed as such.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from inventory_builders import INVENTORIES, ROOT, edit, load_inventory
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_groups, cluster_hostvars

GOLDEN = Path(__file__).with_name("golden")
ANSIBLE_INVENTORY = Path(sys.executable).with_name("ansible-inventory")


def ansible_inventory(source: Path) -> subprocess.CompletedProcess[str]:
    """`ansible-inventory -i <source> --list` with the project's ansible.cfg."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(source), "--list"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def plain(value: Any) -> Any:
    """The --list JSON without ansible-core's untrusted-string markers (inventory data is never a template)."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def golden(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_ansible_inventory_cli_publishes_the_golden_hostvars(name: str) -> None:
    result = ansible_inventory(INVENTORIES[name])
    assert result.returncode == 0, result.stderr
    listed = plain(json.loads(result.stdout))
    expected = golden(name)
    assert {group: listed[group]["hosts"] for group in expected["groups"]} == expected["groups"]
    hostvars = listed["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(expected["hostvars"])
    for host, variables in expected["hostvars"].items():
        # Only the plugin's variables: group_vars next to an inventory may add others.
        assert {key: hostvars[host][key] for key in variables if key in hostvars[host]} == variables


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_plugin_publishes_exactly_the_golden_hostvars(name: str) -> None:
    cluster = load_cluster_file(INVENTORIES[name] / "cluster.yml")
    assert {"groups": cluster_groups(cluster), "hostvars": cluster_hostvars(cluster)} == golden(name)


def test_rejected_inventory_fails_ansible_with_every_problem(tmp_path: Path) -> None:
    bad = edit(
        load_inventory("sim"), {"ranks[2].ring_ports[0].address": "198.19.3.7", "ranks[3].hostname": "sim-r0"}
    )
    (tmp_path / "cluster.yml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    result = ansible_inventory(tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert "ranks[3].hostname: also ranks[0].hostname: every rank is a different machine" in lines
    assert "ranks[2].ring_ports[0].address: 198.19.3.7 is outside edge r2-r3 subnet 198.19.2.0/24" in lines


def test_alias_document_fails_ansible_in_one_line(tmp_path: Path) -> None:
    # A "billion laughs" document: before the loader refused aliases it kept ansible-inventory busy for minutes.
    levels = "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    (tmp_path / "cluster.yml").write_text(
        f"plugin: sparkring_cluster\nversion: 1\na0: &a0 [lol, lol, lol]\n{levels}cluster: *a8\n",
        encoding="utf-8",
    )
    result = ansible_inventory(tmp_path)
    assert result.returncode != 0
    refused = (
        f"{tmp_path / 'cluster.yml'}:3:5: not valid YAML: anchors and aliases are not allowed in cluster.yml"
    )
    assert f"{refused} (found &a0): write each value out" in result.stderr.splitlines()


def test_plugin_reads_only_cluster_files(tmp_path: Path) -> None:
    from ansible.plugins.loader import inventory_loader

    inventory_loader.add_directory(str(ROOT / "plugins/inventory"))
    plugin = inventory_loader.get("sparkring_cluster")
    for name in ("cluster.yml", "cluster.yaml", "hosts.yml", "cluster.yml.bak"):
        (tmp_path / name).write_text("version: 1\n", encoding="utf-8")
    assert plugin.verify_file(str(tmp_path / "cluster.yml"))
    assert plugin.verify_file(str(tmp_path / "cluster.yaml"))
    assert not plugin.verify_file(str(tmp_path / "hosts.yml"))
    assert not plugin.verify_file(str(tmp_path / "cluster.yml.bak"))
    assert not plugin.verify_file(str(tmp_path / "missing" / "cluster.yml"))


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_checked_in_inventories_keep_the_plugin_key(name: str) -> None:
    # Without it, Ansible's plain YAML plugin reads a rejected cluster.yml as an empty inventory.
    assert load_inventory(name)["plugin"] == "sparkring_cluster"
