#!/usr/bin/env python3
"""Fetch one pinned NCCL source archive into a cache outside the repository, verified.

    python3 images/nccl/fetch_source.py [--version 2.29.7-1] [--cache /var/cache/sparkring-nccl]

Prints one JSON line: {"path", "sha256", "fetched"}. A cached archive with the pinned sha256
(or, for a release pinned by its unpacked tree, `source_tree_sha256`, one that unpacks to that
tree) is reused; nothing else is ever trusted. The cache defaults to $SPARKRING_NCCL_CACHE, else
/var/cache/sparkring-nccl. Standard library only (the role runs it on the
controller, the tests import it).

Two kinds of `source_url` in `images/lock.json`:
- a Debian pool URL (`.../pool/<component>/<x>/<source package>/<file>`): fetched through apt,
  with a private configuration (a `deb-src` line for sid and that component, lists and cache
  under the cache directory) built from the archive URI and keyring this machine's own apt
  sources already use; the system's sources are never changed. The Sources index must list
  the file with the pinned sha256, and apt's downloader checks the bytes against it.
- any other https URL: downloaded directly, then checked: its bytes against `source_sha256`, or,
  where only `source_tree_sha256` is pinned (GitHub's archives of a commit, whose bytes depend on
  how GitHub packs them), the tree it unpacks to, by the NCCL build's own unpacking and digest
  (module_utils/sparkring_nccl.py).
A release pinned neither way is refused before anything is downloaded.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from sparkring.module_utils import load_module_utils

from transport.integrity import sha256_file

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "images" / "lock.json"
DEFAULT_CACHE = Path(os.environ.get("SPARKRING_NCCL_CACHE", "/var/cache/sparkring-nccl"))
DEBIAN_SUITE = "sid"  # where Debian keeps nvidia-nccl 2.29.7 (contrib)
APT_HELPER = "/usr/lib/apt/apt-helper"


class FetchError(Exception):
    """The source cannot be had as pinned; the message says why and what to do."""


class SourceUnreachable(FetchError):
    """The archive's host did not answer (no network here): nothing was judged."""


def release_of(lock: dict, version: str | None) -> tuple[str, dict]:
    nccl = lock.get("nccl") or {}
    version = version or nccl.get("default_version")
    releases = nccl.get("releases") or {}
    if version not in releases:
        raise FetchError(f"images/lock.json has no nccl.releases.{version} (pinned: {sorted(releases)})")
    release = releases[version]
    if not release.get("source_sha256") and not release.get("source_tree_sha256"):
        raise FetchError(
            f"nccl.releases.{version}.source_sha256 is not pinned (nor source_tree_sha256): measure the "
            f"archive at {release.get('source_url')} on a machine that can reach it and pin it first"
        )
    return version, release


def matches_pin(archive: Path, release: dict) -> str | None:
    """None if `archive` is the pinned source, else what it is instead (for the refusal). A tree
    pin is checked as the NCCL build checks it: its unpacking, its digest."""
    if release.get("source_sha256"):
        actual, want = sha256_file(archive), release["source_sha256"]
        return None if actual == want else f"sha256 {actual}, the lock pins {want}"
    nccl = load_module_utils("sparkring_nccl")
    with tempfile.TemporaryDirectory(prefix="sparkring-nccl-fetch-") as scratch:
        try:
            actual = nccl.source_tree_digest(
                nccl.extract_source(str(archive), release["source_dir"], Path(scratch))
            )
        except (nccl.NcclBuildError, tarfile.TarError, EOFError, OSError) as error:
            return f"no tree the NCCL build would unpack ({error})"
    want = release["source_tree_sha256"]
    return None if actual == want else f"an unpacked tree with digest {actual}, the lock pins {want}"


def deb822(text: str) -> list[dict[str, str]]:
    """Paragraphs of a deb822 file (apt sources, Sources indexes); comments dropped."""
    paragraphs, current, key = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                paragraphs.append(current)
            current, key = {}, None
        elif line[0] in " \t" and key:
            current[key] += "\n" + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            current[key] = value.strip()
    if current:
        paragraphs.append(current)
    return paragraphs


def system_debian_archive() -> tuple[str, str]:
    """The Debian archive URI and keyring this machine's apt already trusts."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for paragraph in deb822(Path(path).read_text(encoding="utf-8")):
            for uri in paragraph.get("URIs", "").split():
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/"), paragraph.get(
                        "Signed-By", "/usr/share/keyrings/debian-archive-keyring.gpg"
                    )
    raise FetchError(
        "no Debian archive in /etc/apt/sources.list.d/*.sources to fetch the source package from"
    )


def apt_options(cache: Path) -> list[str]:
    apt = cache / "apt"
    return [
        "-o",
        f"Dir::Etc::SourceList={os.devnull}",
        "-o",
        f"Dir::Etc::SourceParts={apt / 'sources.list.d'}",
        "-o",
        f"Dir::State::Lists={apt / 'lists'}",
        "-o",
        f"Dir::Cache={apt / 'cache'}",
        "-o",
        f"Dir::State::status={os.devnull}",
        "-o",
        "APT::Sandbox::User=root",
    ]


def run(argv: list[str], error: type[FetchError] = FetchError) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ | {"LANG": "C"})
    if done.returncode != 0:
        raise error(f"{' '.join(argv[:2])} ... failed: {(done.stdout + done.stderr).strip()[-1500:]}")
    return done.stdout


def fetch_debian(url: str, sha256: str, cache: Path, partial: Path) -> None:
    """apt with a private deb-src configuration; the Sources index must agree with the pin."""
    parts = urlparse(url).path.split("/")
    pool = parts.index("pool")
    component, package, filename = parts[pool + 1], parts[pool + 3], parts[-1]
    uri, keyring = system_debian_archive()
    sources = cache / "apt" / "sources.list.d"
    for sub in (
        sources,
        cache / "apt" / "lists" / "partial",
        cache / "apt" / "cache" / "archives" / "partial",
    ):
        sub.mkdir(parents=True, exist_ok=True)
    (sources / "sparkring-nccl-src.sources").write_text(
        f"Types: deb-src\nURIs: {uri}\nSuites: {DEBIAN_SUITE}\nComponents: {component}\nSigned-By: {keyring}\n",
        encoding="utf-8",
    )
    options = apt_options(cache)
    run(["apt-get", *options, "update"], SourceUnreachable)
    for paragraph in deb822(run(["apt-cache", *options, "showsrc", "--only-source", package])):
        for entry in paragraph.get("Checksums-Sha256", "").splitlines():
            fields = entry.split()
            if len(fields) == 3 and fields[2] == filename:
                if fields[0] != sha256:
                    raise FetchError(
                        f"Debian lists {filename} with sha256 {fields[0]}, the lock pins {sha256}"
                    )
                source = f"{uri}/{paragraph['Directory']}/{filename}"
                run([APT_HELPER, *options, "download-file", source, str(partial), f"SHA256:{sha256}"])
                return
    raise FetchError(
        f"Debian {DEBIAN_SUITE}/{component} no longer lists {filename} ({package}); pin another source"
    )


def fetch(version: str | None = None, cache: Path = DEFAULT_CACHE, lock_path: Path = LOCK) -> dict:
    """Return the cached archive for the pinned release, fetching it first if needed."""
    version, release = release_of(json.loads(lock_path.read_text(encoding="utf-8")), version)
    url, sha256 = release["source_url"], release["source_sha256"]
    target = cache / "src" / os.path.basename(urlparse(url).path)
    if target.is_file() and matches_pin(target, release) is None:
        return {"path": str(target), "sha256": sha256_file(target), "fetched": False}
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    if "/pool/" in urlparse(url).path:
        fetch_debian(url, sha256, cache, partial)
    else:
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
                shutil.copyfileobj(response, out)
        except urllib.error.URLError as error:
            raise SourceUnreachable(f"{url}: {error.reason}") from error
    problem = matches_pin(partial, release)
    if problem:
        partial.unlink()
        raise FetchError(f"{url} has {problem}: refusing it")
    os.replace(partial, target)
    return {"path": str(target), "sha256": sha256_file(target), "fetched": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", help="release key in images/lock.json (default: nccl.default_version)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args()
    try:
        print(json.dumps(fetch(args.version, args.cache, args.lock)))
    except (FetchError, OSError) as error:
        print(f"fetch_source: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
