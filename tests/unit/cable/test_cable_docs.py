"""The modules document themselves: ansible-doc parses DOCUMENTATION, EXAMPLES and RETURN."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE_DOC = Path(sys.executable).with_name("ansible-doc")


@pytest.mark.parametrize(
    ("module", "path"),
    [("sparkring_cable", "library"), ("sparkring_ring_port", "roles/fabric/library")],
)
def test_ansible_doc_parses_the_module(module: str, path: str) -> None:
    done = subprocess.run(
        [str(ANSIBLE_DOC), "-M", str(ROOT / path), "--json", module],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    doc = __import__("json").loads(done.stdout)[module]
    assert doc["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert doc["examples"].strip() and doc["return"]
