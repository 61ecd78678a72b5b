"""The documentation in the repository stays true to itself: README short, links and design citations resolve."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README_LIMIT = 12 * 1024
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")
CITATION = re.compile(r"docs/design\.md ((?:§\d+(?:\.\d+)?(?:, )?)+)")
# The design used to live outside the repository under this name (spelled apart: this file is scanned too).
STALE = ("DESIGN" + " §", "DESIGN" + ".md")
SECTION = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)[. ]", re.M)


def tracked_files() -> list[Path]:
    """The files a commit would hold (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [ROOT / name for name in listed if name and (ROOT / name).is_file()]


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < README_LIMIT, "README.md: move detail into docs/<stage>.md"
    head = readme.splitlines()[:5]
    assert any(line.strip().startswith("make sim") for line in head), head
    assert any(line.strip().startswith("make test") for line in head), head


def test_every_relative_link_resolves() -> None:
    pages = [ROOT / "README.md", ROOT / "THIRD_PARTY_NOTICES.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme_or_the_design() -> None:
    linked = set(LINK.findall((ROOT / "README.md").read_text()))
    linked |= {f"docs/{target}" for target in LINK.findall((ROOT / "docs" / "design.md").read_text())}
    orphans = [page.name for page in (ROOT / "docs").glob("*.md") if f"docs/{page.name}" not in linked]
    assert not orphans, f"docs pages nobody links to: {orphans}"


def test_design_citations_name_existing_sections() -> None:
    sections = set(SECTION.findall((ROOT / "docs" / "design.md").read_text()))
    wrong, stale = [], []
    for path in tracked_files():
        if path.suffix in {".png", ".gz", ".json"}:
            continue
        text = path.read_text(errors="replace")
        if any(old in text for old in STALE):
            stale.append(str(path.relative_to(ROOT)))
        for cited in CITATION.findall(text):
            wrong += [
                f"{path.relative_to(ROOT)}: §{n}"
                for n in re.findall(r"§([\d.]+)", cited)
                if n not in sections
            ]
    assert not stale, f"cite docs/design.md, not DESIGN: {stale}"
    assert not wrong, wrong


def test_license_and_notices() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert "Apache-2.0" in str(declared)
    assert (
        "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    )
    notices = (ROOT / "THIRD_PARTY_NOTICES.md").read_text()
    assert "NCCL" in notices and (ROOT / "images" / "nccl" / "LICENSE.txt").is_file()
