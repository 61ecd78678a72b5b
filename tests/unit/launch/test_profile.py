"""The launch profile: strict parsing, the one geometry function, contradictions named by key."""

from __future__ import annotations

from pathlib import Path

import pytest
from sparkring.profile import (
    DcpGeometry,
    ProfileError,
    dcp_geometry,
    load_profile,
    load_profile_file,
    parse_env_file,
)

BASE = {"MODEL_PATH": "/srv/models/glm", "MODEL_REVISION": "0123abcd"}


def profile(**overrides: str):
    return load_profile(BASE | overrides)


@pytest.mark.parametrize(
    ("dcp", "expected"),
    [
        (1, DcpGeometry(kv_interleave=1, kv_cache_gib=26)),
        (2, DcpGeometry(kv_interleave=4, kv_cache_gib=30)),
        (4, DcpGeometry(kv_interleave=4, kv_cache_gib=30)),
    ],
)
def test_geometry_defaults_follow_the_dcp_degree(dcp: int, expected: DcpGeometry) -> None:
    assert dcp_geometry(dcp) == expected
    assert profile(DCP=str(dcp)).geometry == expected


def test_defaults_are_the_reference_launch() -> None:
    p = profile().for_world(4)
    assert (p.tp, p.dcp, p.max_model_len, p.max_num_batched_tokens) == (4, 1, 1_048_576, 8_192)
    assert p.sparkcache_enabled is True
    assert p.kv_cache_dtype == "fp8"


def test_explicit_values_that_agree_with_the_geometry_are_accepted() -> None:
    p = profile(DCP="4", KV_INTERLEAVE="4", KV_CACHE_GIB="28")
    assert p.geometry == DcpGeometry(kv_interleave=4, kv_cache_gib=28)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"DCP": "4", "KV_INTERLEAVE": "1"}, "KV_INTERLEAVE: 1 contradicts DCP=4"),
        ({"DCP": "1", "KV_INTERLEAVE": "4"}, "KV_INTERLEAVE: 4 contradicts DCP=1"),
        ({"DCP": "2", "FULL_CKV_GATHER": "1"}, "FULL_CKV_GATHER: removed: vLLM gathers the compressed KV"),
        ({"DCP": "3"}, "DCP: expected 1, 2 or 4"),
        ({"DCP": "4", "TP": "2"}, "TP: 2 is not a multiple of DCP=4"),
        ({"UNKNOWN_KEY": "1"}, "UNKNOWN_KEY: unknown key"),
        ({"SPARKCACHE_ENABLED": "yes"}, "SPARKCACHE_ENABLED: expected 0 or 1"),
        ({"SPEC_TOKENS": "3"}, "SPEC_TOKENS: expected 2 or 4"),
        ({"MODEL_PATH": "models/glm"}, "MODEL_PATH: expected an absolute path"),
        ({"EXTRA_VLLM_ARGS": "--x $(reboot)"}, "EXTRA_VLLM_ARGS: contains characters that are not allowed"),
        ({"DRAFT_PATH": "/srv/models/draft"}, "DRAFT_REVISION: required when DRAFT_PATH is set"),
        ({"SPEC_METHOD": "draft_model"}, "SPEC_METHOD: draft_model needs DRAFT_PATH"),
        ({"MASTER_PORT": "8000"}, "MASTER_PORT: must differ from API_PORT"),
    ],
)
def test_contradictions_and_bad_values_name_the_key(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ProfileError) as excinfo:
        profile(**overrides)
    assert any(line.startswith(message) for line in excinfo.value.errors), excinfo.value.errors


def test_tp_must_match_the_cluster() -> None:
    with pytest.raises(ProfileError, match="TP: 4 but the cluster has 2 ranks"):
        profile(TP="4").for_world(2)
    with pytest.raises(ProfileError, match="DCP: 4 does not divide TP=2"):
        profile(DCP="4").for_world(2)
    assert profile(DCP="2").for_world(2).tp == 2


def test_digest_changes_with_any_effective_setting() -> None:
    a = profile(DCP="2").for_world(4)
    assert a.digest() == profile(DCP="2").for_world(4).digest()
    assert a.digest() != profile(DCP="4").for_world(4).digest()
    assert a.digest() != profile(DCP="2", KV_CACHE_GIB="29").for_world(4).digest()


def test_env_file_parsing_is_strict(tmp_path) -> None:
    assert parse_env_file("# comment\nexport A=1\nB='x y'\n\nC=\"z\"\n") == {"A": "1", "B": "x y", "C": "z"}
    with pytest.raises(ProfileError, match="line 2: A is set twice"):
        parse_env_file("A=1\nA=2\n")
    with pytest.raises(ProfileError, match="line 1: expected KEY=VALUE"):
        parse_env_file("not an assignment\n")
    path = tmp_path / "launch.env"
    path.write_text("MODEL_PATH=/m\nMODEL_REVISION=r\nDCP=4\nKV_INTERLEAVE=1\n")
    with pytest.raises(ProfileError) as excinfo:
        load_profile_file(path)
    assert excinfo.value.errors == [
        f"{path}: KV_INTERLEAVE: 1 contradicts DCP=4, which needs 4 (remove the key to take the default)"
    ]


@pytest.mark.parametrize("cluster", ["sim", "example/ring4"])
def test_checked_in_profiles_validate(cluster: str) -> None:
    root = Path(__file__).resolve().parents[3]
    assert load_profile_file(root / "inventories" / cluster / "launch.env").for_world(4).tp == 4
