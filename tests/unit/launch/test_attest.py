"""The attestation record's comparison and redaction (module_utils/sparkring_attest.py), fed with
the real rendering of the example four-Spark ring: what is rank-specific is masked, anything else
that differs names the field and the ranks, and secrets never survive into a record."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from ansible.module_utils import sparkring_attest as attest
from launch_locks import pinned_lock
from sparkring.cluster import load_cluster_file
from sparkring.hostvars import cluster_hostvars
from sparkring.launch_spec import NodeCapabilities, render_rank_spec
from sparkring.profile import load_profile

from transport.integrity import REDACTED, redact_env

ROOT = Path(__file__).resolve().parents[3]

IMAGE = "sparkring/runtime@sha256:" + "cd" * 32


def mount_digest(mount: dict, rank: int) -> str:
    """The ring spec's digest differs per rank (its own ports); everything else is one copy."""
    return f"ring-of-rank-{rank}" if mount.get("rank_specific") else "bb"


def records(dcp: int = 2) -> list[dict]:
    """What the module writes on each rank, built from the rendered specs (node values fixed)."""
    hostvars = cluster_hostvars(load_cluster_file(ROOT / "inventories/example/ring4/cluster.yml"))
    ranks = sorted(hostvars.values(), key=lambda h: h["sparkring_rank"])
    profile = load_profile({"MODEL_PATH": "/srv/models/m", "MODEL_REVISION": "r1", "DCP": str(dcp)})
    node = NodeCapabilities(gpu=True, infiniband=True, cpu_count=20)
    out = []
    for rank_vars in ranks:
        spec = render_rank_spec(profile, rank_vars, ranks[0], node, IMAGE, "fork", pinned_lock())
        out.append(
            {
                "schema": attest.SCHEMA,
                "rank": spec.rank,
                "container_name": spec.container_name,
                "image": {"reference": IMAGE, "id": "sha256:" + "11" * 32},
                "image_files": {"nccl": {"path": "/opt/sparkring/nccl/lib/libnccl.so.2", "sha256": "aa"}},
                "mounts": [
                    {**m, "manifest_sha256": mount_digest(m, spec.rank) if m["read_only"] else None}
                    for m in spec.mounts
                ],
                "env": redact_env(spec.env),
                "labels": spec.labels,
                "secret_env_names": spec.secret_env_names,
                "argv": attest.redact_argv(spec.argv),
                "profile_sha256": spec.labels["sparkring.profile_sha256"],
            }
        )
    return out


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_rendered_ranks_agree(dcp: int) -> None:
    assert attest.disagreements(records(dcp)) == []


def test_ring_spec_is_compared_per_rank_but_a_model_copy_is_not() -> None:
    ranks = records()
    ring_mounts = [m for m in ranks[0]["mounts"] if m.get("rank_specific")]
    assert [m["target"] for m in ring_mounts] == ["/etc/sparkring/ring.json"]
    assert attest.disagreements(ranks) == []  # four different ring.json digests agree
    model = next(m for m in ranks[3]["mounts"] if m["target"] == "/models/model")
    model["manifest_sha256"] = "other-copy"
    assert attest.disagreements(ranks) == [
        'mounts[0].manifest_sha256 differs across ranks (ranks 0,1,2: "bb"; ranks 3: "other-copy")'
    ]


def test_masking_keeps_every_shared_token() -> None:
    head, worker = records()[0], records()[1]
    masked_head, masked_worker = attest.mask_argv(head["argv"]), attest.mask_argv(worker["argv"])
    assert masked_head == masked_worker
    assert "--headless" in worker["argv"] and "--headless" not in masked_worker
    assert "--node-rank" in masked_head and "--master-addr" in masked_head
    assert attest.RANK_MASK in masked_head


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r["image"].update(id="sha256:" + "22" * 32), "image.id"),
        (lambda r: r["image_files"]["nccl"].update(sha256="ff"), "image_files.nccl.sha256"),
        (lambda r: r["mounts"][0].update(manifest_sha256="cc"), "mounts[0].manifest_sha256"),
        (lambda r: r["env"].update(NCCL_ALGO="Tree"), "env.NCCL_ALGO"),
        (lambda r: r.update(profile_sha256="00"), "profile_sha256"),
    ],
)
def test_one_rank_differs_names_field_and_ranks(mutate, field: str) -> None:
    ranks = records()
    mutate(ranks[2])
    problems = attest.disagreements(ranks)
    assert any(p.startswith(f"{field} differs") for p in problems), problems
    line = next(p for p in problems if p.startswith(f"{field} differs"))
    assert "ranks 0,1,3:" in line and "ranks 2:" in line


def test_an_extra_flag_on_one_rank_is_caught() -> None:
    ranks = records()
    argv = ranks[3]["argv"]
    argv.insert(argv.index("--enable-prefix-caching"), "--enforce-eager")
    assert any(p.startswith("argv[") for p in attest.disagreements(ranks))


def test_missing_and_duplicate_records_refuse() -> None:
    assert attest.disagreements([]) != []
    ranks = records()
    assert any("duplicate" in p for p in attest.disagreements([*ranks, copy.deepcopy(ranks[1])]))


def test_secrets_are_redacted() -> None:
    env = redact_env({"HF_TOKEN": "hf_x", "VLLM_API_KEY": "k", "MASTER_ADDR": "1.2.3.4"})
    assert env == {"HF_TOKEN": REDACTED, "MASTER_ADDR": "1.2.3.4", "VLLM_API_KEY": REDACTED}
    argv = attest.redact_argv(["docker", "run", "--env", "HF_TOKEN=hf_x", "--env", "HF_TOKEN", "img"])
    assert "hf_x" not in " ".join(argv) and argv.count("HF_TOKEN") == 1
