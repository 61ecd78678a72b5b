"""library/sparkring_cable.py driven by the YAML cases in cable_cases.yml (UTHelper style)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CASES = yaml.safe_load((Path(__file__).resolve().parent / "cable_cases.yml").read_text())["test_cases"]


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
    statuses = {check["id"]: check["status"] for check in result["checks"]}
    for check_id, status in want.get("checks", {}).items():
        assert statuses.get(check_id) == status, (check_id, result["checks"])
    for check_id, text in want.get("details", {}).items():
        detail = next(check["detail"] for check in result["checks"] if check["id"] == check_id)
        assert text in detail, detail
    if "frames" in want:
        assert [frame["size_bytes"] for frame in result["measurements"]["frames"]] == want["frames"]
    if "counters_delta" in want:
        assert {k: v for k, v in result["measurements"]["counters_delta"].items() if v} == want[
            "counters_delta"
        ]
    if "beacons" in want:
        assert [interface for interface, _identity in result["_beacons"]] == want["beacons"]
