"""The launch refuses an occupied GPU at attestation (library/sparkring_rank_launch, state=attested),
before anything is stopped and in check mode too, naming the rank and every holding process.

There is no GPU here: `nvidia-smi` is a script that prints what nvidia-smi prints (the row format
of `--query-compute-apps`), naming real processes of this machine; `docker` is a script that
lists this cluster's containers. The device lane runs the real thing (tests/device/gpu).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launch_module import run_module, tool
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars
from sparkring.launch_spec import NodeCapabilities, render_rank_spec
from sparkring.lock import load_lock
from sparkring.profile import load_profile

ROOT = Path(__file__).resolve().parents[3]
GPU = "GPU-5c1b3a49-7c4e-1b9f-8f2e-3d2b7b1c9a10"
OURS = "a1" * 32


def spec(gpu: bool) -> dict:
    """Rank 1 of the example four-Spark ring, rendered by the one renderer."""
    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories/example/ring4/cluster.yml"))
    ranks = sorted(hostvars.values(), key=lambda h: h["sparkring_rank"])
    profile = load_profile(
        {"MODEL_PATH": "/srv/models/m", "MODEL_REVISION": "r1", "OVERLAY_MODE": "disabled"}
    )
    node = NodeCapabilities(gpu=gpu, infiniband=True, cpu_count=20)
    return render_rank_spec(
        profile, ranks[1], ranks[0], node, "sparkring/runtime:fork-x", "fork", load_lock()
    ).as_dict()


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rank's PATH: nvidia-smi prints tmp/smi.txt; docker lists our one container and knows nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir, "nvidia-smi", f'cat "{tmp_path}/smi.txt"\n')
    calls = tmp_path / "docker-calls.txt"
    tool(
        bin_dir,
        "docker",
        f'echo "$@" >> "{calls}"\n'
        f'case "$1" in ps) echo {OURS};; *) echo "Error: No such object" >&2; exit 1;; esac\n',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def attest(node: Path, rendered: dict, capsys: pytest.CaptureFixture[str], check_mode: bool) -> dict:
    return run_module({"state": "attested", "spec": rendered, "_ansible_check_mode": check_mode}, capsys)


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_foreign_process_on_the_gpu_is_refused_naming_rank_and_process(
    node: Path, capsys: pytest.CaptureFixture[str], check_mode: bool
) -> None:
    me, gone = os.getpid(), 4194303  # this test (on the host, no container) and a pid that ended
    (node / "smi.txt").write_text(f"{me}, {GPU}, 35210 MiB, python3\n{gone}, {GPU}, [N/A], jupyter-lab\n")
    result = attest(node, spec(gpu=True), capsys, check_mode)
    assert result["failed"]
    assert result["msg"].startswith(
        f"gpu: the GPU of rank 1 is held by pid {me} python3 (35210 MiB on {GPU}); pid {gone} jupyter-lab"
    )
    assert "Stop them (nvidia-smi lists them) and launch again" in result["msg"]
    assert [h["pid"] for h in result["holders"]] == [me, gone]
    # It asked which containers are ours and then touched nothing else.
    calls = (node / "docker-calls.txt").read_text().splitlines()
    assert calls == ["ps --all --quiet --no-trunc --filter label=sparkring.cluster=spark-ring4"]


def test_a_free_gpu_goes_on_to_attest(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "smi.txt").write_text("")
    result = attest(node, spec(gpu=True), capsys, check_mode=True)
    assert not result.get("failed") and result["up_to_date"] is False


def test_unreadable_nvidia_smi_output_is_refused_not_taken_for_free(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (node / "smi.txt").write_text("[Insufficient Permissions]\n")
    result = attest(node, spec(gpu=True), capsys, check_mode=True)
    assert result["failed"] and "gpu: rank 1: cannot tell whether the GPU is free" in result["msg"]


def test_a_rank_without_gpus_asks_nothing(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node / "smi.txt").write_text(f"{os.getpid()}, {GPU}, 1 MiB, python3\n")
    result = attest(node, spec(gpu=False), capsys, check_mode=True)
    assert not result.get("failed")
    assert "ps --all" not in (node / "docker-calls.txt").read_text()
