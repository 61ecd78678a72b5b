"""library/sparkring_cable.py driven by the YAML cases in cable_cases.yml (UTHelper style)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CASES = yaml.safe_load((Path(__file__).resolve().parent / "cable_cases.yml").read_text())["test_cases"]


def _key(check: dict, checks: list[dict]) -> str:
    """A check's ID, with @<interface> where the ID occurs once per twin."""
    if sum(other["id"] == check["id"] for other in checks) == 1:
        return check["id"]
    return f"{check['id']}@{check['subject'].rsplit('(', 1)[-1].rstrip(')')}"


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_cable_case(case, run_case):
    code, result, unrun = run_case(case)
    want = case["output"]
    assert not unrun, f"commands the module did not run: {unrun}"
    assert code == (1 if want.get("failed") else 0), result
    if want.get("failed"):
        assert want["msg"] in result["msg"], result["msg"]
        return
    assert result["changed"] is False
    for key in ("status", "failure_domain"):
        if key in want:
            assert result["verdict"][key] == want[key], result["verdict"]
    if "fix" in want:
        assert want["fix"] in result["verdict"]["fix"], result["verdict"]
    checks = {_key(check, result["checks"]): check for check in result["checks"]}
    for check_id, status in want.get("checks", {}).items():
        assert check_id in checks and checks[check_id]["status"] == status, (check_id, list(checks))
    for check_id, text in want.get("details", {}).items():
        assert text in checks[check_id]["detail"], checks[check_id]["detail"]
    if "frames" in want:
        assert [frame["size_bytes"] for frame in result["measurements"]["frames"]] == want["frames"]
    if "counters_delta" in want:
        moved = {
            f"{iface}.{name}": value
            for iface, delta in result["measurements"]["counters_delta"].items()
            for name, value in delta.items()
            if value
        }
        assert moved == want["counters_delta"]
    if "gid_indices" in want:
        assert result["measurements"]["gid_indices"] == want["gid_indices"]
    if "beacons" in want:
        assert [interface for interface, _identity in result["_beacons"]] == want["beacons"]
