"""sim_ring_shaping: tc tbf on both ends of the named cable only, and gone when the variable is."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [
    pytest.mark.sim,
    pytest.mark.extended("tc tbf on one cable through sim.yml, then taken off again (73 s here)"),
]

RATE, RATE_BYTES = "500mbit", 500_000_000 // 8


def ring_ports(sim_ring) -> dict[tuple[str, str], str]:
    """(rank namespace, ring interface) -> edge id, from the inventory's hostvars."""
    done = sim_ring(["ansible-inventory", "--list"])
    assert done.returncode == 0, done.stderr
    # ansible-inventory marks strings from the plugin as {"__ansible_unsafe": value}.
    unwrap = lambda d: d["__ansible_unsafe"] if set(d) == {"__ansible_unsafe"} else d  # noqa: E731
    hostvars = json.loads(done.stdout, object_hook=unwrap)["_meta"]["hostvars"]
    return {
        (f"sr-{host}", p["interface"]): p["edge"]
        for host, hv in hostvars.items()
        for p in hv["sparkring_ports"]
    }


def tbf_rates(ports: dict[tuple[str, str], str]) -> dict[tuple[str, str], int]:
    """Ring interfaces whose root qdisc is tbf, with its rate in bytes per second."""
    found = {}
    for ns, dev in ports:
        argv = ["tc", "-n", ns, "-j", "qdisc", "show", "dev", dev]
        for qdisc in json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout):
            if qdisc.get("root") and qdisc["kind"] == "tbf":
                found[(ns, dev)] = qdisc["options"]["rate"]
    return found


def test_shaping_follows_the_variable(sim_ring) -> None:
    ports = ring_ports(sim_ring)
    edge = sorted(ports.values())[0]
    shaping = json.dumps({"sim_ring_shaping": {"rate": RATE, "edges": [edge]}})
    try:
        shaped = sim_ring(["ansible-playbook", "playbooks/sim.yml", "-e", shaping])
        assert shaped.returncode == 0, shaped.stdout[-4000:]
        assert tbf_rates(ports) == {end: RATE_BYTES for end, e in ports.items() if e == edge}
    finally:
        plain = sim_ring(["ansible-playbook", "playbooks/sim.yml"])
    assert plain.returncode == 0, plain.stdout[-4000:]
    assert tbf_rates(ports) == {}
