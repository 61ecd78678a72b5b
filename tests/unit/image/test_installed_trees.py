"""The runtime images install the transport, overlay and sparkcache packages with pip; the lock
pins each as a git tree (plugins/sparkring/lock.py), and the launch attestation hashes the installed
tree inside the image, which AC-LOCK compares with the lock (docs/acceptance.md). A tracked file that
pip does not install (pyproject.toml package-data) makes the two differ on every rank."""

from __future__ import annotations

import fnmatch
import tomllib

from sparkring.lock import ROOT, tree_files


def test_the_installed_packages_carry_every_file_of_their_locked_trees() -> None:
    """AC-LOCK compares each package tree hashed inside the image with the lock's hash of the same
    tree in git: a tracked file that pip does not install (package-data) would fail it everywhere."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-data", {})
    missing = [
        name
        for package in ("transport", "overlay", "sparkcache")
        for name in tree_files(ROOT, package)
        if not name.endswith(".py")
        and not any(fnmatch.fnmatch(name, f"{package}/{pattern}") for pattern in data.get(package, []))
    ]
    assert not missing, f"tracked but not installed (pyproject.toml package-data): {missing}"
