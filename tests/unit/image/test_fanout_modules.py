"""What both fan-out modules (sparkring_image_fanout, sparkring_model) take from module_utils/sparkring_fanout.py:
the agent's configuration from their parameters, and the transfer result they return and document."""

from __future__ import annotations

from pathlib import Path

from ansible.parsing.plugin_docs import read_docstring

ROOT = Path(__file__).resolve().parents[3]


MODULES = ("sparkring_image_fanout", "sparkring_model")


def _returned(name: str) -> dict:
    """A module's RETURN as ansible-doc reads it (RETURN takes no fragments: each module states it)."""
    return read_docstring(str(ROOT / "library" / f"{name}.py"))["returndocs"]


def test_both_fanout_modules_document_the_transfer_result_alike(fanout):
    keys = set(fanout.transfer_result(fanout.Stats()))
    image, model = (_returned(name) for name in MODULES)
    assert keys <= set(image) and keys <= set(model)
    assert {key: image[key] for key in keys} == {key: model[key] for key in keys}


def test_rank_config_takes_the_links_and_limits_from_the_module_parameters(fanout, tmp_path):
    params = {key: spec.get("default") for key, spec in fanout.TRANSFER_OPTIONS.items()}
    params |= {
        "rank": 1,
        "world_size": 4,
        "port": 29620,
        "reserve_bytes": 7,
        "io_timeout": 5,
        "fault_corrupt_chunks": [3],
        "ports": [
            {"peer_rank": 2, "address": "198.19.1.1", "peer_address": "198.19.1.2", "cage": 1},
            {"peer_rank": 0, "address": "198.19.0.2", "peer_address": "198.19.0.1", "cage": 0},
        ],
    }
    files = fanout.FileSet((fanout.build_manifest(str(_file(tmp_path)), 1024),))
    config = fanout.rank_config(params, files, str(tmp_path), str(tmp_path / "p.json"), frozenset({"f"}))
    assert config.links == [
        fanout.Link(2, "198.19.1.1", "198.19.1.2"),
        fanout.Link(0, "198.19.0.2", "198.19.0.1"),
    ]
    assert (config.rank, config.world_size, config.port, config.reserve_bytes) == (1, 4, 29620, 7)
    assert (config.io_timeout, config.connect_timeout, config.max_resends) == (5.0, 120.0, 3)
    assert config.fault_corrupt_chunks == frozenset({3}) and config.complete == frozenset({"f"})
    assert config.progress_path == str(tmp_path / "p.json") and config.files is files


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3000)
    return path
