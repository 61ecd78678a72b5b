"""sparkring_netplan for real: the Ansible CLI runs the module on this machine against a scratch
root, and netplan's own parser and generator (Debian netplan.io) judge the file it writes.

Nothing here touches this machine's network: every file lives under a temporary root_dir and
`apply` is off (netplan apply needs a renderer, which only a real node has).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE = Path(sys.executable).with_name("ansible")
NETPLAN = shutil.which("netplan", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
PORTS = {"ring0": "198.19.0.1/24", "ring1": "198.19.3.2/24"}

pytestmark = pytest.mark.skipif(
    NETPLAN is None, reason="netplan is not installed: run `make apt` (netplan.io)"
)


def module(root: Path, *flags: str, **args: Any) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run sparkring_netplan on localhost through the Ansible CLI: (the process, the module's result)."""
    params = {"ports": PORTS, "mtu": 9000, "root_dir": str(root), "apply": False, **args}
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(ROOT / "roles/fabric/library"),
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [str(ANSIBLE), "localhost", "-c", "local", "-i", "localhost,", "-m", "sparkring_netplan"]
    done = subprocess.run(
        [*argv, "-a", json.dumps(params), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The default callback prints any diff, then `localhost | STATUS => {result as JSON}`.
    return done, json.loads(done.stdout.split(" => ", 1)[1])


def generated(root: Path) -> dict[str, str]:
    """What netplan generates from every file under `root`, as networkd units by name."""
    done = subprocess.run(
        [NETPLAN, "generate", "--root-dir", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    network = root / "run/systemd/network"
    return {path.name: path.read_text() for path in sorted(network.glob("*.network"))}


def test_writes_one_file_netplan_reads_as_the_ring_ports(tmp_path: Path) -> None:
    done, result = module(tmp_path)
    assert done.returncode == 0, done.stdout
    path = tmp_path / "etc/netplan/60-sparkring.yaml"
    assert result["changed"] and result["path"] == str(path) and not result["applied"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    units = generated(tmp_path)
    assert sorted(units) == ["10-netplan-ring0.network", "10-netplan-ring1.network"]
    for interface, cidr in PORTS.items():
        unit = units[f"10-netplan-{interface}.network"]
        lines = unit.splitlines()
        assert f"Name={interface}" in lines and "MTUBytes=9000" in lines
        assert [line for line in lines if line.startswith("Address=")] == [f"Address={cidr}"]
        assert "IPv6AcceptRA=no" in lines and "RequiredForOnline=no" in lines
        # No DHCP, no gateway, no route: nothing but the cable's connected route.
        assert not [line for line in lines if line.split("=")[0] in ("DHCP", "Gateway", "Destination")]
        assert "[Route]" not in lines


def test_second_run_changes_nothing_and_check_diff_shows_the_plan(tmp_path: Path) -> None:
    assert module(tmp_path)[1]["changed"]
    path = tmp_path / "etc/netplan/60-sparkring.yaml"
    written = path.read_text()
    done, again = module(tmp_path)
    assert done.returncode == 0 and not again["changed"]
    moved = {"ring0": "198.19.0.7/24", "ring1": None}  # a new address; ring1 keeps only its MTU
    done, planned = module(tmp_path, "--check", "--diff", ports=moved)
    assert done.returncode == 0 and planned["changed"]
    assert '-      addresses: ["198.19.0.1/24"]' in done.stdout
    assert '+      addresses: ["198.19.0.7/24"]' in done.stdout
    assert path.read_text() == written  # check mode wrote nothing
    assert module(tmp_path, ports=moved)[1]["changed"]
    units = generated(tmp_path)
    assert "Address=198.19.0.7/24" in units["10-netplan-ring0.network"].splitlines()
    assert "Address=" not in units["10-netplan-ring1.network"]
    assert "MTUBytes=9000" in units["10-netplan-ring1.network"].splitlines()


def test_other_netplan_files_are_left_alone(tmp_path: Path) -> None:
    installer = tmp_path / "etc/netplan/00-installer-config.yaml"
    installer.parent.mkdir(parents=True)
    installer.write_text("network:\n  version: 2\n  ethernets:\n    enP7s7:\n      dhcp4: true\n")
    installer.chmod(0o600)
    before = installer.read_bytes()
    done, result = module(tmp_path)
    assert done.returncode == 0 and result["changed"]
    assert installer.read_bytes() == before
    assert sorted(generated(tmp_path)) == [
        "10-netplan-enP7s7.network",
        "10-netplan-ring0.network",
        "10-netplan-ring1.network",
    ]


def test_another_file_that_configures_a_ring_port_is_refused_naming_it(tmp_path: Path) -> None:
    other = tmp_path / "etc/netplan/40-cx7.yaml"
    other.parent.mkdir(parents=True)
    # NVIDIA's two-Spark playbook style: link-local IPv4 on the fast ports, matched by name.
    other.write_text(
        "network:\n  version: 2\n  ethernets:\n    cx7:\n      match: {name: 'ring*'}\n      link-local: [ipv4]\n"
    )
    other.chmod(0o600)
    done, result = module(tmp_path)
    assert done.returncode != 0
    assert result["msg"].startswith(f"ring interface ring0 is also configured in {other} (netplan id cx7)")
    assert "Remove ring0 from that file" in result["msg"]
    assert not (tmp_path / "etc/netplan/60-sparkring.yaml").exists()


@pytest.mark.parametrize(
    ("folder", "why"),
    [
        ("run/netplan", "netplan reads it instead of"),
        ("lib/netplan", "hides that file from netplan"),
    ],
)
def test_a_same_named_file_in_run_or_lib_is_refused_naming_it(tmp_path: Path, folder: str, why: str) -> None:
    """netplan reads one file per name, /run before /etc before /lib: another author's
    run/netplan/60-sparkring.yaml shadows SparkRing's (netplan generate then configures no ring
    port), and SparkRing's would shadow a lib/netplan one of the same name."""
    other = tmp_path / folder / "60-sparkring.yaml"
    other.parent.mkdir(parents=True)
    other.write_text("network:\n  version: 2\n  ethernets:\n    enP7s7:\n      dhcp4: true\n")
    other.chmod(0o600)
    before = other.read_bytes()
    done, result = module(tmp_path)
    assert done.returncode != 0, result
    assert result["msg"].startswith(
        f"{other} has the name of SparkRing's {tmp_path}/etc/netplan/60-sparkring.yaml"
    )
    assert why in result["msg"] and "fabric_netplan_file" in result["msg"]
    assert not (tmp_path / "etc/netplan/60-sparkring.yaml").exists()
    assert other.read_bytes() == before


def test_a_file_netplan_refuses_is_never_written(tmp_path: Path) -> None:
    broken = tmp_path / "etc/netplan/50-broken.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("network:\n  version: 2\n  ethernets:\n    eth9:\n      mtu: lots\n")
    broken.chmod(0o600)
    done, result = module(tmp_path)
    assert done.returncode != 0
    assert result["msg"].startswith(
        f"netplan refuses {tmp_path}/etc/netplan/60-sparkring.yaml with the node's other"
    )
    assert f"{broken}:5:12: Error in network definition: invalid unsigned int value 'lots'" in result["msg"]
    assert not (tmp_path / "etc/netplan/60-sparkring.yaml").exists()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        ({"apply": True}, "apply: netplan apply configures the running system, not root_dir"),
        ({"ports": {"ring0": "198.19.0.1"}}, "ports[ring0]: '198.19.0.1' is not an IPv4 address with prefix"),
        ({"file_name": "../60.yaml"}, "file_name '../60.yaml': expected a plain name ending in .yaml"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(
    tmp_path: Path, args: dict[str, Any], expect: str
) -> None:
    done, result = module(tmp_path, **args)
    assert done.returncode != 0 and result["msg"].startswith(expect), result["msg"]
    assert not (tmp_path / "etc").exists()
