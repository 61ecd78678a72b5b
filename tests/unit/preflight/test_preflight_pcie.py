"""PF-PCIE: every RDMA function's PCIe link against its maximum, read from a sysfs tree built here.

The tree is laid out as the kernel lays it out: /sys/class/infiniband/<dev>/device is a relative
link into /sys/devices/pci<domain>/<root port>/<function>, and the root port has its own
max_link_*. The field's case (GB10 firmware before 2026-04): a cage's second function trained at
Gen5 x2 instead of x4.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from test_preflight_checks import PORT  # one Spark-like cage: the port every preflight test reads

SUBJECT = "r1 cage1 <-> r2 cage1"
GEN5 = "32.0 GT/s PCIe"


def _write(folder: Path, **attrs: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in attrs.items():
        (folder / name).write_text(value + "\n")


def _function(
    sysfs: Path,
    device: str,
    domain: str,
    function: str,
    speed: str,
    width: int,
    max_width: int = 4,
    port_width: int = 4,
    fw: str = "28.45.1200",
) -> None:
    """One RDMA device on its PCI function below a root port, linked from class/infiniband."""
    root_port = sysfs / "devices" / f"pci{domain}:00" / f"{domain}:00:00.0"
    _write(
        root_port,
        max_link_speed=GEN5,
        max_link_width=str(port_width),
        current_link_speed=speed,
        current_link_width=str(width),
    )
    _write(
        root_port / function,
        max_link_speed=GEN5,
        max_link_width=str(max_width),
        current_link_speed=speed,
        current_link_width=str(width),
    )
    ib = sysfs / "class" / "infiniband" / device
    _write(ib, fw_ver=fw)
    (ib / "device").symlink_to(os.path.relpath(root_port / function, ib))


def _spark(sysfs: Path, second_width: int = 4) -> str:
    """A Spark's cage 1: its first function on domain 0000, its second on 0002 (x2 when trained short)."""
    _function(sysfs, "rocep1s0f1", "0000", "0000:01:00.1", GEN5, 4)
    _function(sysfs, "roceP2p1s0f1", "0002", "0002:01:00.1", GEN5, second_width)
    _write(sysfs / "class" / "dmi" / "id", bios_version="fw-2026.02", bios_date="02/10/2026")
    return str(sysfs)


def _pcie(preflight, sysfs: str, fabric: str = "verbs", ports=None):
    params = {"rank": 1, "fabric": fabric, "ports": [PORT] if ports is None else ports}
    checker = preflight.Preflight(params, run=None, which=lambda name, required: name, sysfs=sysfs)
    return checker._pcie(), checker.pcie


def test_both_twins_at_gen5_x4_pass_and_report_their_link_and_firmware(preflight, tmp_path):
    results, facts = _pcie(preflight, _spark(tmp_path))
    assert [(r.id, r.status, r.subject) for r in results] == [
        ("PF-PCIE", "pass", f"{SUBJECT} (ring1)"),
        ("PF-PCIE", "pass", f"{SUBJECT} (ring1b)"),
    ]
    assert results[1].detail == (
        "roceP2p1s0f1 (0002:01:00.1) PCIe Gen5 x4 (32.0 GT/s), its maximum; NIC firmware 28.45.1200, "
        "board firmware fw-2026.02 02/10/2026"
    )
    assert facts["board"] == {"bios_version": "fw-2026.02", "bios_date": "02/10/2026"}
    assert facts["functions"]["roceP2p1s0f1"] == {
        "device": "roceP2p1s0f1",
        "address": "0002:01:00.1",
        "speed_gt_s": 32.0,
        "width": 4,
        "max_speed_gt_s": 32.0,
        "max_width": 4,
        "firmware": "28.45.1200",
        "at_maximum": True,
    }


def test_a_twin_trained_at_gen5_x2_fails_naming_it_and_the_firmware_fix(preflight, tmp_path):
    results, facts = _pcie(preflight, _spark(tmp_path, second_width=2))
    first, second = results
    assert (first.status, second.status) == ("pass", "fail")
    assert second.subject == f"{SUBJECT} (ring1b)"
    assert second.detail.startswith(
        "roceP2p1s0f1 (0002:01:00.1) trained at PCIe Gen5 x2 (32.0 GT/s), below its maximum Gen5 x4 (32.0 GT/s): "
        "this function moves at most 50% of its share of the cable (ring1b); NIC firmware 28.45.1200, "
        "board firmware fw-2026.02 02/10/2026"
    ), second.detail
    assert "update the node's firmware" in second.fix and "before 2026-04" in second.fix
    assert "lspci -vv -s 0002:01:00.1" in second.fix
    assert facts["functions"]["roceP2p1s0f1"]["at_maximum"] is False


def test_a_function_below_its_speed_fails_too(preflight, tmp_path):
    _function(tmp_path, "rocep1s0f1", "0000", "0000:01:00.1", GEN5, 4)
    _function(tmp_path, "roceP2p1s0f1", "0002", "0002:01:00.1", "16.0 GT/s PCIe", 4)
    second = _pcie(preflight, str(tmp_path))[0][1]
    assert second.status == "fail" and "trained at PCIe Gen4 x4 (16.0 GT/s), below its maximum Gen5 x4" in (
        second.detail
    )
    assert "board firmware" not in second.detail  # no DMI in this tree: nothing invented


def test_the_maximum_is_bounded_by_the_upstream_port(preflight, link_facts, tmp_path):
    """An x16-capable function behind an x4 root port at x4 is at its maximum (as the kernel bounds it)."""
    _function(tmp_path, "rocep1s0f1", "0000", "0000:01:00.1", "32 GT/s", 4, max_width=16, port_width=4)
    link = link_facts.read_pcie_link("rocep1s0f1", str(tmp_path))
    assert (link.speed_gt_s, link.width, link.max_speed_gt_s, link.max_width) == (32.0, 4, 32.0, 4)
    assert link.at_maximum


def test_software_rdma_and_an_untrained_link_are_skips_that_say_why(preflight, link_facts, tmp_path):
    _write(tmp_path / "class" / "infiniband" / "rocep1s0f1", fw_ver="1.0")  # rxe: no PCI function
    _function(tmp_path, "roceP2p1s0f1", "0002", "0002:01:00.1", "Unknown", 4)
    soft, untrained = _pcie(preflight, str(tmp_path))[0]
    assert (soft.status, untrained.status) == ("skip", "skip")
    assert "not applicable: rocep1s0f1 is not a PCIe function" in soft.detail
    assert "reports no trained PCIe speed and width" in untrained.detail
    assert link_facts.read_pcie_link("rocep1s0f1", str(tmp_path)).address is None


def test_a_missing_device_is_left_to_pf_rdma_bind(preflight, tmp_path):
    _function(tmp_path, "rocep1s0f1", "0000", "0000:01:00.1", GEN5, 4)
    results, _facts = _pcie(preflight, str(tmp_path))
    assert [r.status for r in results] == ["pass", "skip"]
    assert results[1].detail == "no RDMA device roceP2p1s0f1 on this node (see PF-RDMA-BIND)"


def test_the_sim_has_no_rdma_function_and_says_so_not_a_pass(preflight, tmp_path):
    tcp_port = {**PORT, "twins": [{"interface": "ring1"}, {"interface": "ring1b"}]}
    results, facts = _pcie(preflight, str(tmp_path), fabric="tcp", ports=[tcp_port])
    assert [(r.id, r.status, r.subject) for r in results] == [("PF-PCIE", "skip", "r1")]
    assert results[0].detail.startswith("not applicable: fabric tcp, no RDMA function to check")
    assert facts == {}


@pytest.mark.parametrize("text", ["32.0 GT/s PCIe", "32 GT/s", "32.0 GT/s"])
def test_speed_formats_the_kernel_writes(link_facts, text):
    assert link_facts._pcie_rate(text) == 32.0
    assert link_facts._pcie_rate("Unknown") is None


def test_the_module_reads_sysfs_root_and_reports_the_x2_twin(preflight, tmp_path, capsys):
    """Through main(): the sysfs_root option reaches every reader, and the result carries PF-PCIE
    and the pcie facts the role writes into rank<N>.json."""
    sysfs = _spark(tmp_path / "sys", second_width=2)
    args = {
        "rank": 1,
        "hostname": "sim-r1",
        "fabric": "verbs",
        "mtu": 9000,
        "management": {"interface": "mgmt0", "address": "198.19.254.11", "prefix": 24},
        "ports": [PORT],
        "docker_host": f"unix://{tmp_path}/no-docker.sock",
        "sysfs_root": sysfs,
    }
    with patch_module_args(args), pytest.raises(SystemExit):
        preflight.main()
    result = json.loads(capsys.readouterr().out)
    pcie = [c for c in result["checks"] if c["id"] == "PF-PCIE"]
    assert [(c["subject"], c["status"]) for c in pcie] == [
        (f"{SUBJECT} (ring1)", "pass"),
        (f"{SUBJECT} (ring1b)", "fail"),
    ]
    assert "trained at PCIe Gen5 x2" in pcie[1]["detail"]
    assert result["pcie"]["functions"]["roceP2p1s0f1"]["width"] == 2
