"""Golden rendering of the per-rank container spec for the example four-Spark ring.

Set SPARKRING_REGENERATE_GOLDEN=1 to rewrite the golden files after an intended change, and
review the diff: these argv lists are exactly what the ranks will run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from launch_locks import pinned_lock
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars
from sparkring.launch_spec import NodeCapabilities, render_rank_spec
from sparkring.profile import GIB, load_profile

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
SPARK = NodeCapabilities(gpu=True, infiniband=True, cpu_count=20)
IMAGE = "sparkring/runtime@sha256:" + "ab" * 32
CASES = [(dcp, cache) for dcp in (1, 2, 4) for cache in (1, 0)]


def ring4() -> list[dict]:
    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories/example/ring4/cluster.yml"))
    return sorted(hostvars.values(), key=lambda h: h["sparkring_rank"])


def render_all(dcp: int, sparkcache: int) -> list[dict]:
    profile = load_profile(
        {
            "MODEL_PATH": "/srv/models/GLM-5.3-Flash",
            "MODEL_REVISION": "0123456789abcdef0123456789abcdef01234567",
            "SERVED_MODEL_NAME": "glm-5.3-flash",
            "DCP": str(dcp),
            "SPARKCACHE_ENABLED": str(sparkcache),
        }
    )
    ranks = ring4()
    lock = pinned_lock()
    return [render_rank_spec(profile, r, ranks[0], SPARK, IMAGE, "fork", lock).as_dict() for r in ranks]


@pytest.mark.parametrize(("dcp", "sparkcache"), CASES)
def test_rendering_matches_golden(dcp: int, sparkcache: int) -> None:
    specs = render_all(dcp, sparkcache)
    path = GOLDEN / f"ring4-dcp{dcp}-sparkcache{sparkcache}.json"
    if os.environ.get("SPARKRING_REGENERATE_GOLDEN") == "1":
        path.write_text(json.dumps(specs, indent=1, sort_keys=True) + "\n")
    assert specs == json.loads(path.read_text())


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("dcp", "sparkcache"), CASES)
def test_load_bearing_settings(dcp: int, sparkcache: int) -> None:
    interleave, gib = (1, 26) if dcp == 1 else (4, 30)
    for spec in render_all(dcp, sparkcache):
        argv, serve = spec["argv"], spec["vllm_argv"]
        assert argv[:2] == ["docker", "run"]
        assert _flag(argv, "--network") == "host" and _flag(argv, "--ipc") == "host"
        assert _flag(argv, "--ulimit") == "memlock=-1:-1" and _flag(argv, "--cap-add") == "IPC_LOCK"
        assert _flag(argv, "--device") == "/dev/infiniband" and _flag(argv, "--gpus") == "all"
        assert "type=bind,source=/srv/models/GLM-5.3-Flash,target=/models/model,readonly" in argv
        assert serve[0] == "vllm" and argv[argv.index(IMAGE) + 1 :] == serve[1:]
        assert ("--headless" in serve) == (spec["rank"] != 0)
        assert ("--port" in serve) == (spec["rank"] == 0)
        assert _flag(serve, "--tensor-parallel-size") == "4" and _flag(serve, "--nnodes") == "4"
        assert _flag(serve, "--node-rank") == str(spec["rank"])
        assert _flag(serve, "--master-addr") == "192.0.2.10"
        assert _flag(serve, "--decode-context-parallel-size") == str(dcp)
        assert _flag(serve, "--cp-kv-cache-interleave-size") == str(interleave)
        assert _flag(serve, "--kv-cache-memory-bytes") == str(gib * GIB)
        assert not [key for key in spec["env"] if "CKV" in key]  # no setting without an effect
        assert "--enable-prefix-caching" in serve
        assert ("--kv-transfer-config" in serve) == bool(sparkcache)
        env = spec["env"]
        assert env["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
        # One NCCL device per cage, fused from its twins (NCCL alone would fuse the two cages).
        assert (env["NCCL_IB_MERGE_NICS"], env["NCCL_NET_FORCE_MERGE"]) == (
            "1",
            "rocep1s0f0,roceP2p1s0f0;rocep1s0f1,roceP2p1s0f1",
        )
        assert (env["NCCL_IB_SUBNET_AWARE_ROUTING"], env["NCCL_IB_SUBNET_PREFIX_LEN"]) == ("1", "24")
        assert (env["NCCL_IB_GID_INDEX"], env["NCCL_IB_ADDR_FAMILY"], env["NCCL_IB_ROCE_VERSION_NUM"]) == (
            "-1",
            "AF_INET",
            "2",
        )
        assert (env["NCCL_NET"], env["NCCL_NET_PLUGIN"], env["NCCL_IB_DISABLE"], env["NCCL_CROSS_NIC"]) == (
            "IB",
            "none",
            "0",
            "1",
        )
        assert env["NCCL_SWITCHLESS_RING"] == "1"


def test_secrets_are_passed_by_name_only() -> None:
    os.environ["HF_TOKEN"] = "hf_secret_value_never_rendered"
    try:
        specs = render_all(4, 1)
    finally:
        del os.environ["HF_TOKEN"]
    text = json.dumps(specs)
    assert "hf_secret_value_never_rendered" not in text
    for spec in specs:
        assert spec["argv"].count("HF_TOKEN") == 1 and "VLLM_API_KEY" in spec["argv"]


def test_workers_differ_only_in_rank_specific_values() -> None:
    ranks = ring4()
    masked = []
    for spec in render_all(2, 1)[1:]:
        rank = spec["rank"]
        text = json.dumps(spec, sort_keys=True)
        for value in (f"sparkring-rank{rank}", ranks[rank]["sparkring_management"]["address"]):
            text = text.replace(value, "<rank-specific>")
        text = text.replace(f"sparkring.rank={rank}", "sparkring.rank=<rank-specific>")
        text = text.replace(f'"--node-rank", "{rank}"', '"--node-rank", "<rank-specific>"')
        text = text.replace(f'"SPARKRING_RANK={rank}"', '"SPARKRING_RANK=<rank-specific>"')
        masked.append({k: v for k, v in json.loads(text).items() if k not in ("rank", "env", "labels")})
    assert masked[0] == masked[1] == masked[2]
