"""Chunk keys, DCP ownership, cache identity and the enable switch: pure logic."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkcache.chunks import chunk_keys
from sparkcache.dcp import local_slot, local_tokens, token_owner
from sparkcache.identity import CacheIdentity
from sparkcache.settings import SparkCacheSettings, enabled, kv_transfer_config, vllm_serve_args

BASE = CacheIdentity("model@1", "none", "float32", "layout", 128, 4, 0, 1, 0, 1)


def test_chunk_keys_name_whole_prefixes() -> None:
    tokens = list(range(1000))
    keys = chunk_keys(tokens)
    assert len(keys) == 3  # 1000 tokens: three full chunks, the tail has no key
    assert chunk_keys(tokens[:768]) == keys
    changed = tokens.copy()
    changed[10] = 99999  # a change in chunk 0 changes every later key
    assert not set(chunk_keys(changed)) & set(keys)
    changed = tokens.copy()
    changed[600] = 99999  # a change in chunk 2 keeps chunks 0 and 1
    assert chunk_keys(changed)[:2] == keys[:2] and chunk_keys(changed)[2] != keys[2]
    assert chunk_keys(tokens, salt="tenant-b") != keys


@pytest.mark.parametrize(
    ("interleave", "dcp", "owners"),
    [
        (1, 1, [0] * 8),
        (1, 4, [0, 1, 2, 3, 0, 1, 2, 3]),
        (4, 2, [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]),
        (4, 4, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0]),
    ],
)
def test_token_owner_is_t_div_interleave_mod_dcp(interleave: int, dcp: int, owners: list[int]) -> None:
    assert [token_owner(t, interleave, dcp) for t in range(len(owners))] == owners


@given(
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(0, 2000),
    st.integers(0, 600),
)
def test_dcp_shards_partition_tokens_and_pack_densely(
    dcp: int, interleave: int, start: int, length: int
) -> None:
    shards = [local_tokens(start, start + length, r, interleave, dcp) for r in range(dcp)]
    assert sorted(t for s in shards for t in s) == list(range(start, start + length))
    for rank in range(dcp):
        slots = [
            local_slot(t, interleave, dcp) for t in local_tokens(0, start + length, rank, interleave, dcp)
        ]
        assert slots == list(range(len(slots)))  # each rank's own tokens fill its KV densely


def test_identity_separates_every_geometry_field() -> None:
    variants = {
        "model_revision": "model@2",
        "draft_revision": "draft@1",
        "kv_dtype": "fp8_e4m3",
        "kv_layout": "other",
        "block_size": 64,
        "tp_size": 2,
        "tp_rank": 1,
        "dcp_size": 2,
        "interleave": 4,
        "namespace": "manager-pages-v1",
    }
    digests = {BASE.digest()}
    for field, value in variants.items():
        digests.add(CacheIdentity(**{**BASE.record(), field: value}).digest())
    digests.add(CacheIdentity(**{**BASE.record(), "dcp_size": 2, "dcp_rank": 1}).digest())
    assert len(digests) == len(variants) + 2
    assert json.loads(BASE.canonical())["namespace"] == "manager-pages-v2"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tp_rank": 4}, "tp_rank 4 is outside"),
        ({"dcp_size": 3}, "must divide TP size"),
        ({"interleave": 3}, "interleave 3 must divide"),
        ({"block_size": 96}, "not whole blocks"),
        ({"dcp_size": 4, "block_size": 128}, "not whole blocks"),
    ],
)
def test_identity_refuses_inconsistent_geometry(changes: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheIdentity(**{**BASE.record(), **changes})


def test_blocks_per_chunk_and_shards_under_dcp() -> None:
    assert BASE.blocks_per_chunk == 2  # CPU: 128-token blocks
    assert BASE.shard_tokens(1) == list(range(256, 512))
    dcp4 = [
        CacheIdentity(**{**BASE.record(), "block_size": 16, "dcp_size": 4, "dcp_rank": r, "interleave": 4})
        for r in range(4)
    ]
    assert dcp4[0].blocks_per_chunk == 4  # each virtual block spans 16 x 4 tokens
    assert dcp4[1].shard_tokens(0)[:6] == [4, 5, 6, 7, 20, 21]
    shards = [ident.shard_tokens(2) for ident in dcp4]
    assert all(len(s) == 64 for s in shards)  # every rank holds a quarter of every chunk
    assert sorted(t for s in shards for t in s) == list(range(512, 768))


def test_switch_off_means_no_connector_arguments() -> None:
    conf = SparkCacheSettings(root="/srv/sc", max_bytes=1 << 30)
    assert vllm_serve_args(conf, {"SPARKCACHE_ENABLED": "0"}) == []
    args = vllm_serve_args(conf, {"SPARKCACHE_ENABLED": "1"})
    assert args[0] == "--kv-transfer-config"
    rendered = json.loads(args[1])
    assert rendered == kv_transfer_config(conf)
    assert rendered["kv_connector_module_path"] == "sparkcache.connector"
    assert rendered["kv_load_failure_policy"] == "recompute"
    assert rendered["kv_connector_extra_config"] == {"root": "/srv/sc", "max_bytes": 1 << 30}
    with pytest.raises(ValueError, match="expected 1"):
        enabled({"SPARKCACHE_ENABLED": "yes"})


def test_extra_config_rejects_unknown_keys() -> None:
    assert SparkCacheSettings.from_extra_config({"root": "/x", "ttl_seconds": 60}).limits().ttl_seconds == 60
    launch = {"root": "/x", "draft_revision": None, "dcp": 4, "kv_interleave": 4}  # the launch's shape
    conf = SparkCacheSettings.from_extra_config(launch)
    assert (conf.draft_revision, conf.dcp, conf.kv_interleave) == ("none", 4, 4)
    assert SparkCacheSettings.from_extra_config(conf.extra_config()) == conf
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_byte'\]"):
        SparkCacheSettings.from_extra_config({"max_byte": 1})
