"""Ansible inventory plugin: one host per rank of a validated SparkRing cluster.yml."""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r"""
name: sparkring_cluster
short_description: SparkRing cluster inventory (cluster.yml), strictly validated
description:
  - Reads C(inventories/<name>/cluster.yml) (or C(cluster.yaml)), which describes the ranks of a
    switchless ring of DGX Sparks (or of the simulated ring), their cables, addresses, cages,
    RDMA devices and ssh targets.
  - Validates it with the pydantic schema in C(plugins/sparkring/cluster.py); any problem fails
    the whole inventory with every problem listed, one per line, field path first.
  - Yields one host per rank in the groups C(sparkring), C(sparkring_head) (rank 0) and
    C(sparkring_workers), with the hostvars described in C(docs/inventory.md)
    (rank, world size, neighbours, ring ports and their peers, matching rounds, ssh target).
  - "Start the file with C(plugin: sparkring_cluster), so that Ansible's plain YAML inventory
    plugin never reads a rejected cluster.yml as an empty inventory."
options: {}
"""

EXAMPLES = r"""
# ansible.cfg
#   [inventory]
#   enable_plugins = sparkring_cluster, ...
# then validate and show a cluster:
#   ansible-inventory -i inventories/example/ring4 --list
"""

# The schema lives in the controller-side `sparkring` package (pyproject.toml installs it).
from sparkring.cluster import ClusterValidationError, load_cluster_file  # noqa: E402
from sparkring.hostvars import cluster_groups, cluster_hostvars  # noqa: E402

FILE_NAMES = ("cluster.yml", "cluster.yaml")


class InventoryModule(BaseInventoryPlugin):
    """Publishes the ranks of one cluster.yml; refuses the file whole on any problem."""

    NAME = "sparkring_cluster"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and os.path.basename(path) in FILE_NAMES

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        try:
            cluster = load_cluster_file(path)
        except ClusterValidationError as error:
            raise AnsibleParserError(str(error)) from None
        for group, hosts in cluster_groups(cluster).items():
            self.inventory.add_group(group)
            for host in hosts:
                self.inventory.add_host(host, group=group)
        for host, hostvars in cluster_hostvars(cluster).items():
            for name, value in hostvars.items():
                self.inventory.set_variable(host, name, value)
