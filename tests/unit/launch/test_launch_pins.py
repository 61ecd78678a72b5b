"""The launch plan refuses an overlay without pins for the runtime image, before any rank is touched.

The example four-Spark ring's profile (OVERLAY_MODE=custom) is rendered through the filter Ansible
calls (`sparkring_rank_spec`) for each GB10 flavor. The upstream flavor (the example inventories')
renders with the pins the committed lock holds for it. The fork flavor's image has no pins in the
lock: the plan is refused, naming the image, its vLLM and the fix; with pins for that image in a
lock, it renders and the spec carries them to the attestation.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from launch_locks import fork_pins
from launch_module import run_module, tool
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars
from sparkring.lock import LOCK_PATH, load_lock, with_overlay_pins

from overlay.registry import PATCHES
from plugins.filter.sparkring_launch import sparkring_rank_spec

ROOT = Path(__file__).resolve().parents[3]
RING4 = ROOT / "inventories" / "example" / "ring4"
SPARK = {"gpu": True, "infiniband": True, "cpu_count": 20}
IMAGE = "sparkring/runtime:fork-0123456789abcdef"


def ranks() -> list[dict]:
    hostvars = cluster_hostvars(load_cluster_file(RING4 / "cluster.yml"))
    return sorted(hostvars.values(), key=lambda h: h["sparkring_rank"])


def render(lock_path: Path, profile: Path = RING4 / "launch.env", flavor: str = "fork") -> list[dict]:
    every = ranks()
    return [
        sparkring_rank_spec(r, every[0], str(profile), SPARK, IMAGE, flavor, str(lock_path)) for r in every
    ]


def test_the_example_ring_on_the_upstream_flavor_renders_with_the_committed_pins() -> None:
    pins = load_lock().overlay_pins_for("upstream")
    assert (
        pins is not None
    )  # measured in the lock's vLLM wheel (playbooks/overlay-pins.yml, overlay_pins_wheel)
    specs = render(LOCK_PATH, flavor="upstream")
    assert [spec["rank"] for spec in specs] == [0, 1, 2, 3]
    assert all(spec["overlay_pins"] == pins.model_dump() for spec in specs)
    assert all("SPARKRING_OVERLAY_MODE=custom" in spec["argv"] for spec in specs)
    assert all("--kv-cache-dtype" in spec["vllm_argv"] and "--gpus" in spec["argv"] for spec in specs)


def test_an_unknown_flavor_is_refused_naming_the_inventory_field() -> None:
    with pytest.raises(
        AnsibleFilterError,
        match=r"image_flavor: 'gb10' is not a runtime image flavor; expected one of upstream, fork, sim",
    ):
        render(LOCK_PATH, flavor="gb10")


def test_the_fork_flavor_is_refused_at_plan_time_while_its_image_has_no_pins() -> None:
    lock = load_lock()
    assert lock.overlay_pins_for("fork") is None  # the committed lock: nobody has pinned the fork image yet
    with pytest.raises(AnsibleFilterError) as refused:
        render(LOCK_PATH)
    message = str(refused.value)
    assert message.startswith("launch refused before anything was touched: OVERLAY_MODE=custom: ")
    assert (
        "images/lock.json has no overlay pins for the fork runtime image "
        f"({lock.base_images['fork'].reference}@{lock.base_images['fork'].digest}, "
        f"vLLM {lock.vllm.fork_from_base})"
    ) in message
    assert "playbooks/overlay-pins.yml --check --diff" in message and "OVERLAY_MODE=disabled" in message


def test_with_pins_for_that_image_it_renders_and_the_spec_carries_them(tmp_path: Path) -> None:
    lock = load_lock()
    pinned = tmp_path / "lock.json"
    pinned.write_text(with_overlay_pins(LOCK_PATH.read_text(), "fork", fork_pins(lock)))
    specs = render(pinned)
    assert [spec["rank"] for spec in specs] == [0, 1, 2, 3]
    assert all(spec["overlay_pins"] == fork_pins(lock) for spec in specs)
    assert all("SPARKRING_OVERLAY_MODE=custom" in spec["argv"] for spec in specs)


def test_pins_of_an_older_base_do_not_count(tmp_path: Path) -> None:
    lock = load_lock()
    stale = json.loads(LOCK_PATH.read_text())
    old = "ghcr.io/fujitsupolycom/gb10-vllm-base@sha256:" + "0" * 64
    stale["overlay_pins"] = {**stale.get("overlay_pins", {}), "fork": {**fork_pins(lock), "image": old}}
    path = tmp_path / "lock.json"
    path.write_text(json.dumps(stale))
    with pytest.raises(AnsibleFilterError, match=f"it holds pins for {old}, which it no longer builds from"):
        render(path)


def test_overlay_disabled_needs_no_pins(tmp_path: Path) -> None:
    profile = tmp_path / "launch.env"
    text = (RING4 / "launch.env").read_text().replace("OVERLAY_MODE=custom", "OVERLAY_MODE=disabled")
    profile.write_text(text)
    specs = render(LOCK_PATH, profile)
    assert all(spec["overlay_pins"] is None for spec in specs)


# ---- the attestation (library/sparkring_rank_launch, state=attested) against the image ----

IMAGE_ID = "sha256:" + "1d" * 32


@pytest.fixture
def rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rank whose docker holds IMAGE (IMAGE_ID) and runs the attestation's probe with this
    machine's python3 over a stand-in vLLM 0.11.2 tree (the probe's own code, unchanged)."""
    site = tmp_path / "site"
    for patch in PATCHES:
        path = site / patch.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {patch.file} as the fork image has it\n")
    (site / "vllm" / "__init__.py").write_text("")
    info = site / "vllm-0.11.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {load_lock().vllm.fork_from_base}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(
        bin_dir,
        "docker",
        'case "$1" in\n'
        f'  image) echo \'[{{"Id": "{IMAGE_ID}"}}]\';;\n'
        # docker run ... --entrypoint python3 IMAGE -c PROBE ARGS: the probe, with the image's
        # sparkring_integrity (module_utils' copy) and vLLM on its path
        '  run) while [ "$1" != "--entrypoint" ]; do shift; done; shift 3\n'
        '       PYTHONPATH="' + f"{ROOT / 'module_utils'}:{site}" + '" exec python3 "$@";;\n'
        "  *) exit 1;;\n"
        "esac\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return site


def rank_spec(pins: dict, tmp_path: Path) -> dict:
    """Rank 2's spec, rendered against a lock holding ``pins`` for the fork image."""
    lock_path = tmp_path / "lock.json"
    lock_path.write_text(with_overlay_pins(LOCK_PATH.read_text(), "fork", pins))
    every = ranks()
    node = {"gpu": False, "infiniband": True, "cpu_count": 20}
    return sparkring_rank_spec(
        every[2], every[0], str(RING4 / "launch.env"), node, IMAGE, "fork", str(lock_path)
    )


def measured(site: Path) -> dict:
    lock = load_lock()
    files = {patch.file: hashlib.sha256((site / patch.file).read_bytes()).hexdigest() for patch in PATCHES}
    return fork_pins(lock) | {"files": files}


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_changed_target_file_in_the_image_is_refused_naming_file_rank_and_fix(
    rank: Path, capsys: pytest.CaptureFixture[str], check_mode: bool, tmp_path: Path
) -> None:
    pins = measured(rank)
    scheduler = rank / "vllm/v1/core/sched/scheduler.py"
    scheduler.write_bytes(scheduler.read_bytes().replace(b"# vllm", b"#.vllm", 1))  # one byte
    args = {"state": "attested", "spec": rank_spec(pins, tmp_path), "attest_dir": str(tmp_path / "att")}
    result = run_module(args | {"_ansible_check_mode": check_mode}, capsys)
    assert result["failed"]
    found = hashlib.sha256(scheduler.read_bytes()).hexdigest()
    pinned = pins["files"]["vllm/v1/core/sched/scheduler.py"]
    assert result["msg"].startswith(f"overlay pins: image {IMAGE} on rank 2 does not match images/lock.json")
    assert result["problems"] == [f"vllm/v1/core/sched/scheduler.py has sha256 {found}, pinned {pinned}"]
    assert "Rebuild the image from the lock (playbooks/image.yml)" in result["msg"]
    assert not (tmp_path / "att").exists()  # refused before any record was written


def test_an_image_built_without_the_pins_is_refused(
    rank: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The files match, but the image's own record (read by the overlay at start) has no pins."""
    args = {"state": "attested", "spec": rank_spec(measured(rank), tmp_path), "_ansible_check_mode": True}
    result = run_module(args, capsys)
    assert result["failed"] and result["problems"] == [
        "its build record (/opt/sparkring/image.json) carries other overlay pins than the lock "
        "(the image was built before the last pinning)"
    ]


def test_check_mode_predicts_whether_the_attestation_record_changes(
    rank: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--check says changed exactly when the real run would write a new record, and writes nothing."""
    spec = rank_spec(measured(rank), tmp_path) | {"overlay_pins": None}  # OVERLAY_MODE=disabled
    spec["mounts"] = [mount for mount in spec["mounts"] if not mount["read_only"]]  # no model on this rank
    args = {"state": "attested", "spec": spec, "attest_dir": str(tmp_path / "att")}
    planned = run_module(args | {"_ansible_check_mode": True}, capsys)
    assert planned["changed"] and not (tmp_path / "att").exists()
    first = run_module(args, capsys)
    assert first["changed"]
    written = sorted(p.name for p in (tmp_path / "att").iterdir())
    assert run_module(args | {"_ansible_check_mode": True}, capsys)["changed"] is False
    assert run_module(args, capsys)["changed"] is False
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == written
