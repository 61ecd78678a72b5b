"""Wheel sets as pip sees them: the platform tags of an image's base, and pip's report as the lock's entries.

Shared by the wheel-lock module (on rank 0, as `ansible.module_utils.sparkring_wheels`) and the
image build context on the controller (`sparkring.module_utils.load_module_utils`), so that the
tags a set is resolved for are the tags its wheelhouse is downloaded for. Standard library only.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

MANYLINUX = re.compile(r"^manylinux_2_([0-9]+)_(aarch64|x86_64)$")
# The legacy manylinux names and the glibc they stand for (PEP 600).
LEGACY = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platform_tags(platform: str) -> list[str]:
    """`manylinux_2_Y_arch` and every older manylinux tag of `arch`, newest first, as pip accepts natively."""
    match = MANYLINUX.match(platform)
    if match is None:
        raise ValueError(platform)
    newest, arch = int(match.group(1)), match.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    # manylinux2010 and manylinux1 were x86 only; manylinux2014 also covers aarch64.
    legacy = [
        f"{name}_{arch}"
        for minor, name in LEGACY.items()
        if minor <= newest and (arch == "x86_64" or minor == 17)
    ]
    return tags + legacy


def locked_wheel(item: dict) -> dict:
    """One entry of pip's installation report as the lock holds it; ValueError names what is missing."""
    metadata, info = item.get("metadata", {}), item.get("download_info", {})
    name, version, url = metadata.get("name"), metadata.get("version"), info.get("url", "")
    where = f"{name} {version} ({url})"
    file = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    if not file.endswith(".whl"):
        raise ValueError(f"{where}: not a wheel; the image installs wheels only")
    sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
    if not sha256:
        raise ValueError(f"{where}: the index gives no sha256 for it, so it cannot be pinned")
    return {"name": name, "version": version, "file": file, "sha256": sha256}
