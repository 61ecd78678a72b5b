"""The acceptance gates' rules (plugins/sparkring/acceptance.py) on the data the playbook collects."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from sparkring import acceptance
from sparkring.lock import LOCK_PATH, ROOT, load_lock
from sparkring.models import model_pins
from sparkring.profile import load_profile_file

from tests.project_code import load_project_file

FILTERS = ROOT / "plugins" / "filter" / "sparkring_acceptance.py"
LOCK = load_lock().model_dump(mode="json")
LOCK_SHA = "f" * 64
# The sim's models as the launch role joins them (launch_models: profile, lock, inventory).
SIM_PINS = model_pins(
    load_profile_file(ROOT / "inventories" / "sim" / "launch.env"), load_lock(), "sim-target", ""
)
IMAGE = "sha256:" + "a" * 64
NONE_PROFILE = {
    "nccl_mode": "none",
    "sparkcache_enabled": True,
    "model_path": "/opt/sparkring/models/sim-tiny",
    "model_revision": "sim-tiny-v1",
    "draft_path": None,
    "draft_revision": None,
}


def test_plan_keeps_the_fixed_order_and_refuses_unknown_gates() -> None:
    plan = acceptance.plan(["ac-cells", "AC-LOCK"], NONE_PROFILE)
    assert [g["id"] for g in plan] == list(acceptance.GATE_IDS)
    assert [g["id"] for g in plan if g["run"]] == ["AC-LOCK", "AC-CELLS"]
    with pytest.raises(
        acceptance.AcceptanceError, match=r"unknown gate\(s\) \['AC-NOPE'\]; the gates are AC-LOCK"
    ):
        acceptance.plan(["AC-NOPE"], NONE_PROFILE)
    with pytest.raises(acceptance.AcceptanceError, match="empty"):
        acceptance.plan([], NONE_PROFILE)


def test_plan_skips_sparkcache_when_the_profile_switches_it_off() -> None:
    plan = {g["id"]: g for g in acceptance.plan(None, {"sparkcache_enabled": False})}
    assert not plan["AC-SPARKCACHE"]["run"] and "SPARKCACHE_ENABLED=0" in plan["AC-SPARKCACHE"]["note"]
    assert acceptance.skipped(plan["AC-SPARKCACHE"])["status"] == "skip"
    assert acceptance.skipped(plan["AC-CELLS"])["status"] == "not-run"


def rank_facts(rank: int) -> dict:
    """What gate_lock.yml collects on a healthy sim rank."""
    argv = ["docker", "run", "--name", f"sparkring-rank{rank}", "img", "serve"]
    sources = {name: tree["sha256"] for name, tree in LOCK["source_trees"].items()}
    pins = acceptance.pinned_model_files(SIM_PINS)
    return {
        "rank": rank,
        "up_to_date": True,
        "container": {"Name": f"sparkring-rank{rank}", "Running": True, "Id": "c", "Image": IMAGE},
        "record": {
            "argv": argv,
            "image": {"id": IMAGE},
            "image_files": {"nccl": {"sha256": None}},
        },
        "image_json": {"lock_sha256": LOCK_SHA, "sources_sha256": sources},
        "spec_argv": argv,
        "model_files": [{"item": pin, "stat": {"exists": True, "checksum": pin["sha256"]}} for pin in pins],
        "nccl": None,
    }


def test_lock_passes_when_every_pin_holds_on_every_rank() -> None:
    verdict = acceptance.lock_verdict(
        LOCK, LOCK_SHA, NONE_PROFILE, {"lock": LOCK, "image_id": IMAGE}, [rank_facts(r) for r in range(4)]
    )
    assert verdict["status"] == "pass", verdict["problems"]
    assert verdict["rank"] is None and verdict["id"] == "AC-LOCK"
    assert {c["check"] for c in verdict["evidence"]["checks"]} >= {
        "attested-launch",
        "image",
        "nccl",
        "model-sim-target",
    }


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            lambda r: r["model_files"][1]["stat"].update(checksum="0" * 64),
            "model-sim-target: /opt/sparkring/models/sim-tiny/config.json",
        ),
        (lambda r: r["model_files"][3]["stat"].update(exists=False), "model.safetensors: missing"),
        (lambda r: r.update(up_to_date=False), "attested-launch"),
        (lambda r: r["record"].update(argv=["other"]), "record-argv"),
        (lambda r: r["container"].update(Image="sha256:" + "b" * 64), "image: record"),
        (
            lambda r: r["image_json"]["sources_sha256"].update(overlay="1" * 64),
            "source-overlay: the running image was built from 1111",
        ),
        (lambda r: r["image_json"].update(lock_sha256="5" * 64), "image-lock"),
        (lambda r: r.update(image_json=None), "source-transport: the running image was built from None"),
        (
            lambda r: r["record"]["image_files"]["nccl"].update(sha256="2" * 64),
            "NCCL_MODE=none but the image carries",
        ),
    ],
)
def test_lock_fails_naming_the_rank_whose_input_changed(change, needle) -> None:
    ranks = [rank_facts(r) for r in range(4)]
    change(ranks[2])
    verdict = acceptance.lock_verdict(LOCK, LOCK_SHA, NONE_PROFILE, {"lock": LOCK, "image_id": IMAGE}, ranks)
    assert verdict["status"] == "fail" and verdict["rank"] == 2 and verdict["failing_ranks"] == [2]
    assert any(needle in p for p in verdict["problems"]), verdict["problems"]
    assert acceptance.failure_line(verdict).startswith("AC-LOCK failed on rank 2: ")


def test_lock_checks_the_patched_nccl_against_the_lock() -> None:
    release = LOCK["nccl"]["releases"][LOCK["nccl"]["default_version"]]
    library = "3" * 64
    ranks = [rank_facts(r) for r in range(4)]
    for r in ranks:
        r["record"]["image_files"]["nccl"]["sha256"] = library
        r["nccl"] = {
            "source": {"sha256": release["source_sha256"]},
            "patches": copy.deepcopy(release["patches"]),
            "output": {"sha256": library},
        }
    identity = {"lock": LOCK, "image_id": IMAGE}
    assert (
        acceptance.lock_verdict(LOCK, LOCK_SHA, {**NONE_PROFILE, "nccl_mode": "patched"}, identity, ranks)[
            "status"
        ]
        == "pass"
    )
    ranks[1]["nccl"]["patches"][0]["sha256"] = "4" * 64
    verdict = acceptance.lock_verdict(
        LOCK, LOCK_SHA, {**NONE_PROFILE, "nccl_mode": "patched"}, identity, ranks
    )
    assert verdict["rank"] == 1 and "nccl-source" in verdict["problems"][0]


def test_lock_fails_the_ring_when_the_image_was_built_from_another_lock() -> None:
    other = {**LOCK, "version": 1, "models": {}}
    verdict = acceptance.lock_verdict(
        LOCK, LOCK_SHA, NONE_PROFILE, {"lock": other, "image_id": IMAGE}, [rank_facts(0)]
    )
    assert verdict["status"] == "fail" and verdict["rank"] is None
    assert "another images/lock.json" in verdict["problems"][0]


SITE_CHECK = """
TASK [fabric : Configure the ring ports] ***************************************
ok: [sr-r0]
changed: [sr-r2]
ok: [sr-r1]

TASK [launch : Start this rank (refuses unless every rank's attestation agrees)] ***
changed: [sr-r2 -> sr-r0]

PLAY RECAP *********************************************************************
sr-r0                      : ok=80   changed=0    unreachable=0    failed=0    skipped=20   rescued=0    ignored=0
sr-r1                      : ok=80   changed=0    unreachable=0    failed=0    skipped=20   rescued=0    ignored=0
sr-r2                      : ok=80   changed=2    unreachable=0    failed=0    skipped=20   rescued=0    ignored=0
"""
HOSTS = {"sr-r0": 0, "sr-r1": 1, "sr-r2": 2, "sr-r3": 3}


def test_site_check_names_the_ranks_and_tasks_that_would_change() -> None:
    verdict = acceptance.site_check_verdict(SITE_CHECK, 0, HOSTS)
    assert verdict["status"] == "fail" and verdict["failing_ranks"] == [2, 3]
    assert verdict["problems"][0] == (
        "sr-r2 changed=2: fabric : Configure the ring ports, "
        "launch : Start this rank (refuses unless every rank's attestation agrees)"
    )
    assert "missing from the play recap" in verdict["problems"][1]
    clean = SITE_CHECK.replace("changed=2", "changed=0") + SITE_CHECK.splitlines()[-1].replace(
        "sr-r2", "sr-r3"
    ).replace("changed=2", "changed=0")
    assert acceptance.site_check_verdict(clean, 0, HOSTS)["status"] == "pass"
    assert acceptance.site_check_verdict(clean, 2, HOSTS)["problems"] == [
        "ansible-playbook site.yml --check exited 2"
    ]


def done(i: int, text: str, ttft: float = 0.5, error: str | None = None) -> dict:
    return {"id": f"p{i}", "text": text, "ttft_s": ttft, "error": error}


def test_determinism_compares_every_text_and_shows_where_they_part() -> None:
    same = [done(0, "abc"), done(1, "def")]
    assert acceptance.determinism_verdict(same, copy.deepcopy(same))["status"] == "pass"
    verdict = acceptance.determinism_verdict(same, [done(0, "abc"), done(1, "dxf")])
    assert verdict["status"] == "fail" and verdict["rank"] is None
    assert verdict["problems"] == [
        "prompt p1: outputs differ from character 1: 'ef' before, 'xf' after the replacement"
    ]
    failed = acceptance.determinism_verdict(same, [done(0, "abc"), done(1, "", error="HTTP 500: boom")])
    assert failed["problems"] == ["prompt p1: request failed: HTTP 500: boom"]
    assert "not attributable" not in acceptance.failure_line(
        failed
    ) and "the ring (no single rank)" in acceptance.failure_line(failed)


RESTORED = "INFO SparkCache: loaded 512 tokens (2 page(s) verified) for request cmpl-1\n"


def test_sparkcache_needs_every_rank_to_restore_and_the_same_outputs() -> None:
    cold, warm = [done(0, "x", 1.0), done(1, "y", 1.2)], [done(0, "x", 0.2), done(1, "y", 0.3)]
    logs = {r: RESTORED * 2 for r in range(4)}
    verdict = acceptance.sparkcache_verdict(cold, warm, logs, [512, 512])
    assert verdict["status"] == "pass", verdict["problems"]
    assert [t["ratio"] for t in verdict["evidence"]["ttft"]] == [0.2, 0.25]
    logs[2] = RESTORED + (
        "WARNING SparkCache: request cmpl-2: page 1f2e sha256 mismatch; 2 block(s) will be recomputed\n"
        "INFO SparkCache: loaded 256 tokens (1 page(s) verified) for request cmpl-2\n"
    )
    verdict = acceptance.sparkcache_verdict(cold, warm, logs, [512, 512])
    assert verdict["status"] == "fail" and verdict["rank"] == 2
    assert "rank 2 did not restore every long prompt (loaded [512, 256] tokens" in verdict["problems"][0]
    assert "page 1f2e sha256 mismatch" in verdict["problems"][0]
    assert verdict["evidence"]["outputs_equal"] is True
    logs[2] = RESTORED  # one prompt restored, the other silently not
    assert acceptance.sparkcache_verdict(cold, warm, logs, [512, 512])["rank"] == 2
    differs = acceptance.sparkcache_verdict(
        cold, [done(0, "x"), done(1, "z")], {r: RESTORED * 2 for r in range(4)}, [512, 512]
    )
    assert differs["rank"] is None and "differs from the cold run" in differs["problems"][0]


def test_summary_lists_every_gate_and_ends_with_the_verdict() -> None:
    gates = [
        {**acceptance.result("AC-LOCK", {0: []}, "12 of 12 pin checks passed", "", {}), "seconds": 2.04},
        {
            **acceptance.result(
                "AC-CELLS", {0: ["cell x: 1 of 3 requests failed"]}, "x", "see the log", {"cells": []}
            ),
            "seconds": 30.0,
        },
        acceptance.skipped({"id": "AC-SPARKCACHE", "run": True}),
    ]
    run = {"cluster": "sim", "started_utc": "20261201T120000Z", "commit": "abc", "evidence_dir": "/e"}
    text = acceptance.summary_text(run, gates)
    assert "AC-LOCK            PASS    -          2.0  12 of 12 pin checks passed" in text
    assert "AC-CELLS           FAIL    0         30.0  x" in text
    assert "AC-SPARKCACHE      NOT-RUN" in text
    assert text.rstrip().endswith(
        "RESULT: FAILED. AC-CELLS failed on rank 0: cell x: 1 of 3 requests failed; fix: see the log"
    )


def test_the_filters_hand_plain_data_to_the_rules_and_name_refusals() -> None:
    filters = load_filters(FILTERS)
    logs = {"0": RESTORED * 2, "1": RESTORED * 2}
    cold = [done(0, "x", 1.0), done(1, "y", 1.0)]
    # a 600-token prompt restores its two full 256-token chunks: 512 tokens
    assert filters["sparkring_acceptance_sparkcache"](cold, cold, logs, [600, 600])["status"] == "pass"
    assert filters["sparkring_acceptance_sparkcache"](cold, cold, logs, [900, 600])["failing_ranks"] == [0, 1]
    with pytest.raises(AnsibleFilterError, match="unknown gate"):
        filters["sparkring_acceptance_plan"](["AC-NOPE"], NONE_PROFILE)
    # the lock filter compares the running images' build records with the checkout's lock file bytes
    ranks = [rank_facts(r) for r in range(4)]
    for r in ranks:
        r["image_json"]["lock_sha256"] = hashlib.sha256(LOCK_PATH.read_bytes()).hexdigest()
    identity = {"lock": LOCK, "image_id": IMAGE}
    assert filters["sparkring_acceptance_lock"](ranks, NONE_PROFILE, identity)["status"] == "pass"
    ranks[3]["image_json"]["lock_sha256"] = LOCK_SHA
    assert filters["sparkring_acceptance_lock"](ranks, NONE_PROFILE, identity)["failing_ranks"] == [3]


def test_lock_hashes_every_file_of_every_served_model_where_the_profile_puts_it() -> None:
    files = acceptance.pinned_model_files(SIM_PINS)
    lock_files = LOCK["models"]["sim-target"]["files"]
    assert [f["path"] for f in files] == [f"/opt/sparkring/models/sim-tiny/{f['path']}" for f in lock_files]
    assert [f["sha256"] for f in files] == [f["sha256"] for f in lock_files]


QUALIFY_FILTERS = ROOT / "roles" / "qualify" / "filter_plugins" / "sparkring_qualify.py"


def load_filters(path) -> dict:
    return load_project_file(path).FilterModule().filters()


def burn_report(flip: int | None, missing: int | None = None) -> dict:
    """The qualify role's own merge (sparkring_burn_report) of four probe documents, as burn.yml
    registers them; ``flip`` is the rank whose probe ran with the test hook (one result differs)."""
    hostvars = {}
    for rank in range(4):
        burns = [
            {
                "collective": "all_reduce",
                "dtype": "float32",
                "size_bytes": 16384,
                "iterations": 200,
                "mismatches": 1 if rank == flip else 0,
            }
        ]
        doc = {"ok": rank != flip, "error": None, "rank": rank, "seconds": 1.0, "burns": burns}
        run = (
            {"rc": 0, "stdout": json.dumps(doc)}
            if rank != missing
            else {"rc": 1, "stdout": "", "stderr": "boom"}
        )
        hostvars[f"r{rank}"] = {"sparkring_rank": rank, "qualify_burn_run": run}
    merge = load_filters(QUALIFY_FILTERS)["sparkring_burn_report"]
    return merge(hostvars, list(hostvars), {"cluster": "sim", "check_mode": False})


def test_ring_burn_names_the_rank_whose_result_differs() -> None:
    passed = acceptance.burn_verdict(burn_report(None))
    assert passed["status"] == "pass" and passed["summary"].startswith("four-rank burn passed: 4 ranks")
    verdict = acceptance.burn_verdict(burn_report(1))
    assert verdict["failing_ranks"] == [1]
    assert verdict["problems"] == [
        "rank 1 (r1): all_reduce float32 16384 B: 1 of 200 results differ from the reference"
    ]
    assert acceptance.failure_line(verdict).startswith(
        "AC-RING-BURN failed on rank 1: rank 1 (r1): all_reduce"
    )
    silent = acceptance.burn_verdict(burn_report(None, missing=3))
    assert silent["failing_ranks"] == [3] and "no burn result (exit 1): boom" in silent["problems"][0]
    assert acceptance.burn_verdict({"summary": "four-rank burn skipped"})["problems"][0].startswith(
        "the burn produced no result"
    )


def test_the_role_runs_every_gate_by_default_in_the_catalog_order() -> None:
    defaults = yaml.safe_load((ROOT / "roles" / "acceptance" / "defaults" / "main.yml").read_text())
    assert defaults["acceptance_gates"] == list(acceptance.GATE_IDS)
    assert [g["id"] for g in acceptance.plan(defaults["acceptance_gates"], NONE_PROFILE) if g["run"]] == list(
        acceptance.GATE_IDS
    )
