"""The ring the overlay reads: the inventory -> the overlay role's ring.json -> the transport's ports.

A RoCE GID index of 0 is a real index (the first GID of the port), not "unset": it must reach the
transport as 0, not as "auto".
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
import yaml
from sparkring.cluster import Cluster
from sparkring.hostvars import cluster_hostvars

from overlay.ring import ring_spec

ROOT = Path(__file__).resolve().parents[3]
RING_TEMPLATE = ROOT / "roles" / "overlay" / "templates" / "ring.json.j2"
EXAMPLE_RING4 = ROOT / "inventories" / "example" / "ring4" / "cluster.yml"


def render_ring_json(hostvars: dict) -> str:
    """The overlay role's template, rendered as Ansible renders it (to_json is json.dumps)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    return env.from_string(RING_TEMPLATE.read_text()).render(**hostvars)


@pytest.mark.parametrize("gid_index", [0, 3, "auto"])
def test_gid_index_reaches_the_transport_as_the_inventory_says(
    gid_index: int | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load(EXAMPLE_RING4.read_text())
    for rank in data["ranks"]:
        for port in rank["ring_ports"]:
            # A fixed index names the address twin's IPv4-mapped GID; the other twin's is "auto".
            port["twins"][0]["rdma"]["gid_index"] = gid_index
    data.pop("plugin", None)
    hostvars = cluster_hostvars(Cluster.model_validate(data))
    for host, rank_vars in hostvars.items():
        path = tmp_path / f"{host}-ring.json"
        path.write_text(render_ring_json(rank_vars))
        monkeypatch.setenv("SPARKRING_RING_SPEC", str(path))
        spec = ring_spec(rank_vars["sparkring_rank"], rank_vars["sparkring_world_size"])
        assert [[twin.gid_index for twin in port.twins] for port in spec.ports] == [[gid_index, "auto"]] * 2
        assert [[twin.rdma_device for twin in port.twins] for port in spec.ports] == [
            [twin["rdma_device"] for twin in port["twins"]] for port in rank_vars["sparkring_ports"]
        ]


def test_communicator_settings_default_to_the_fabrics_and_read_the_launch_environment() -> None:
    from overlay.ring import communicator_settings
    from transport.fabric_tcp import DEFAULT_STRIPE_MIN_BYTES

    assert communicator_settings({}) == {
        "fabric": "tcp",
        "tcp_port": 18600,
        "timeout_s": 120.0,
        "setup_timeout_s": 600.0,
        "connections": None,  # tcp's four, verbs' one (transport.Communicator)
        "stripe_min_bytes": DEFAULT_STRIPE_MIN_BYTES,
    }
    assert communicator_settings({"SPARKRING_TRANSPORT_FABRIC": "verbs"})["connections"] is None
    got = communicator_settings(
        {"SPARKRING_TRANSPORT_CONNECTIONS": "2", "SPARKRING_TRANSPORT_STRIPE_MIN_BYTES": "4194304"}
    )
    assert (got["connections"], got["stripe_min_bytes"]) == (2, 4 << 20)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"SPARKRING_TRANSPORT_CONNECTIONS": "five"},
            "SPARKRING_TRANSPORT_CONNECTIONS='five' is not an integer",
        ),
        ({"SPARKRING_TRANSPORT_CONNECTIONS": "5"}, "SPARKRING_TRANSPORT_CONNECTIONS=5: 1 to 4"),
        (
            {"SPARKRING_TRANSPORT_CONNECTIONS": "2", "SPARKRING_TRANSPORT_FABRIC": "verbs"},
            "applies to the tcp fabric",
        ),
        ({"SPARKRING_TRANSPORT_STRIPE_MIN_BYTES": "0"}, "SPARKRING_TRANSPORT_STRIPE_MIN_BYTES=0"),
        ({"SPARKRING_TRANSPORT_TIMEOUT_S": "soon"}, "SPARKRING_TRANSPORT_TIMEOUT_S='soon' is not a number"),
    ],
)
def test_a_bad_transport_setting_is_refused_naming_its_variable(environ: dict, message: str) -> None:
    from overlay.ring import communicator_settings

    with pytest.raises(ValueError, match=message):
        communicator_settings(environ)
