"""CI runs every download and build path from empty caches (issue 18: a fresh machine failed at a
task every warm cache skipped). Each cache the project keeps outside the clone has one knob,
$SPARKRING_<NAME>_CACHE; .ci/run points every knob the code reads at a new empty directory, and the
roles' cache variables really follow their knob."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
KNOB = re.compile(r"SPARKRING_[A-Z0-9]+_CACHE")
# Where a cache knob is read: role defaults, the image/NCCL tooling, the transport's native build.
READERS = ["roles/*/defaults/main.yml", "images/**/*.py", "transport/*.py"]


def knobs_read() -> set[str]:
    return {
        knob for pattern in READERS for path in ROOT.glob(pattern) for knob in KNOB.findall(path.read_text())
    }


def test_ci_points_every_cache_knob_at_a_new_empty_directory() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'^CACHES=\$\(mktemp -d "[^"]*"\)$', ci, re.M), "the caches live in a new directory"
    exported = set(re.findall(r"^export (SPARKRING_[A-Z]+_CACHE)=\$CACHES/\w+$", ci, re.M))
    read = knobs_read()
    assert {"SPARKRING_IMAGE_CACHE", "SPARKRING_NCCL_CACHE", "SPARKRING_TRANSPORT_CACHE"} <= read
    assert read <= exported, f"caches CI would reuse from an earlier run: {sorted(read - exported)}"
    assert 'rm -rf "$CACHES"' in ci


def test_the_opt_in_lanes_caches_stay_out_of_ci() -> None:
    # `make arm64` (and `make softroce`) keep caches of their own for minutes of emulated
    # debootstrap; CI runs neither lane, so their knobs need no fresh directory there, but no code
    # that CI runs may read them.
    owned = re.compile(r"\$\{(" + KNOB.pattern + r"):-")  # a knob the lane reads, with its default
    lanes = {knob for path in ROOT.glob("tests/*/run.sh") for knob in owned.findall(path.read_text())}
    assert "SPARKRING_ARM64_CACHE" in lanes
    assert not lanes & knobs_read(), (
        f"code CI runs reads an opt-in lane's cache: {sorted(lanes & knobs_read())}"
    )
    recipe = re.search(r"^test: .*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S)
    assert recipe and "arm64" not in recipe.group(0) and "softroce" not in recipe.group(0)


def test_no_task_names_a_cache_directory_of_its_own() -> None:
    hardcoded = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in ROOT.glob("roles/*/tasks/*.yml")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "/var/cache/" in line
    ]
    assert not hardcoded, f"cache paths outside the roles' cache variables: {hardcoded}"


def test_the_roles_cache_variables_follow_their_knobs(tmp_path: Path) -> None:
    play = tmp_path / "caches.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_vars: {ROOT}/roles/image/defaults/main.yml\n"
        f"    - ansible.builtin.include_vars: {ROOT}/roles/nccl/defaults/main.yml\n"
        "    - ansible.builtin.debug:\n        msg: 'caches {{ image_cache_dir }} {{ nccl_cache_dir }}'\n"
    )
    env = dict(
        os.environ,
        SPARKRING_IMAGE_CACHE="/tmp/ci-image",
        SPARKRING_NCCL_CACHE="/tmp/ci-nccl",
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
    )
    playbook = Path(sys.executable).with_name("ansible-playbook")

    def play_output() -> str:
        done = subprocess.run(
            [str(playbook), "-i", "localhost,", str(play)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "caches /tmp/ci-image /tmp/ci-nccl" in play_output()
    del env["SPARKRING_IMAGE_CACHE"], env["SPARKRING_NCCL_CACHE"]
    assert "caches /var/cache/sparkring-image /var/cache/sparkring-nccl" in play_output()
