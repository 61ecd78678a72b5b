"""PF-GPU-FREE: who holds a rank's GPU, from nvidia-smi's compute-apps rows (module_utils/sparkring_gpu),
less this cluster's own containers; fed with nvidia-smi's real output format and a /proc of cgroup files."""

from __future__ import annotations

from pathlib import Path

import pytest

OURS = "a1" * 32  # a container of this cluster (label sparkring.cluster=ring4)
OTHER = "b2" * 32  # somebody else's container
GPU = "GPU-5c1b3a49-7c4e-1b9f-8f2e-3d2b7b1c9a10"
# `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader`
SMI_ROWS = (
    f"2817, {GPU}, 40960 MiB, /usr/bin/python3\n"
    f"3301, {GPU}, [N/A], VLLM::Worker_TP0\n"
    f"4242, {GPU}, 1024 MiB, /opt/conda/bin/python3 -m ipykernel_launcher -f kernel, notebook.json\n"
)


@pytest.fixture(scope="module")
def gpu():
    import ansible.module_utils.sparkring_gpu as module

    return module


@pytest.fixture
def proc(tmp_path: Path) -> str:
    """A /proc where 2817 runs on the host, 3301 in our container, 4242 in another container."""
    cgroups = {
        2817: "0::/user.slice/user-1000.slice/session-3.scope\n",
        3301: f"0::/system.slice/docker-{OURS}.scope\n",
        4242: f"12:memory:/docker/{OTHER}\n0::/docker/{OTHER}\n",
    }
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return str(tmp_path)


def test_rows_parse_with_unaccounted_memory_and_commas_in_the_name(gpu) -> None:
    rows = gpu.parse_compute_apps(SMI_ROWS)
    assert [(p.pid, p.gpu_uuid, p.used_memory) for p in rows] == [
        (2817, GPU, "40960 MiB"),
        (3301, GPU, "[N/A]"),
        (4242, GPU, "1024 MiB"),
    ]
    assert rows[2].name == "/opt/conda/bin/python3 -m ipykernel_launcher -f kernel, notebook.json"
    assert str(rows[0]) == f"pid 2817 /usr/bin/python3 (40960 MiB on {GPU})"


@pytest.mark.parametrize("text", ["", "\n", "No running processes found\n"])
def test_no_process_is_no_row(gpu, text: str) -> None:
    assert gpu.parse_compute_apps(text) == []


@pytest.mark.parametrize(
    "text", ["[Insufficient Permissions]\n", "2817, GPU-1\n", "pid, gpu_uuid, used_memory, process_name\n"]
)
def test_anything_else_is_an_error_never_free(gpu, text: str) -> None:
    with pytest.raises(gpu.GpuQueryError, match="is not 'pid, gpu_uuid, used_memory, name'"):
        gpu.parse_compute_apps(text)


def test_our_containers_are_excepted_and_everything_else_is_named(gpu, proc: str) -> None:
    rows = gpu.parse_compute_apps(SMI_ROWS)
    foreign = gpu.foreign_processes(rows, {OURS}.__contains__, proc)
    assert [p.pid for p in foreign] == [2817, 4242]
    # A process that ended between nvidia-smi and the /proc read still counts: fail closed.
    assert [p.pid for p in gpu.foreign_processes(rows, {OURS, OTHER}.__contains__, "/nonexistent")] == [
        2817,
        3301,
        4242,
    ]


def test_judge_gpu_free(judges, gpu) -> None:
    rows = gpu.parse_compute_apps(SMI_ROWS)
    assert judges.judge_gpu_free(1, [], None).status == "pass"
    assert judges.judge_gpu_free(1, None, None).status == "skip"
    bad = judges.judge_gpu_free(1, rows[:1], None)
    assert (bad.id, bad.status, bad.subject) == ("PF-GPU-FREE", "fail", "r1")
    assert "pid 2817 /usr/bin/python3 (40960 MiB" in bad.detail and "stop those processes" in bad.fix
    error = judges.judge_gpu_free(1, None, "nvidia-smi exit 9")
    assert error.status == "fail" and "cannot tell who holds the GPU" in error.detail


# What `docker container inspect` tells of each: OURS carries this cluster's label, OTHER another's.
CONTAINERS = {
    OURS: {"Name": f"/{OURS[:4]}", "Config": {"Labels": {"sparkring.cluster": "ring4"}}},
    OTHER: {"Name": f"/{OTHER[:4]}", "Config": {"Labels": {"com.example": "notebook"}}},
}


def test_preflight_reads_nvidia_smi_and_asks_docker_whose_container_it_is(
    preflight, gpu, proc: str, docker_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module's own path: nvidia-smi's rows, /proc, the Docker helper for the cluster label."""
    monkeypatch.setattr(
        preflight, "foreign_processes", lambda rows, ours: gpu.foreign_processes(rows, ours, proc)
    )
    docker = docker_cli(CONTAINERS, "unix:///run/rank2/docker.sock")
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, SMI_ROWS, ""

    params = {
        "rank": 2,
        "ports": [],
        "cluster_name": "ring4",
        "docker_host": "unix:///run/rank2/docker.sock",
        "require_gpu": True,
    }
    checker = preflight.Preflight(params, run, lambda name, required: f"/usr/bin/{name}", docker=docker)
    result = checker._gpu_free()
    assert calls == [["/usr/bin/nvidia-smi", *gpu.COMPUTE_APPS_ARGS]]
    assert (result.id, result.status, result.subject) == ("PF-GPU-FREE", "fail", "r2")
    assert "pid 2817 /usr/bin/python3" in result.detail and "pid 4242" in result.detail
    assert "pid 3301" not in result.detail  # ours: the launch replaces it
