"""The one join of launch profile, image lock and inventory (plugins/sparkring/models.py): the
revision check that stops the model stage before anything is read or moved."""

from __future__ import annotations

import pytest
from sparkring import lock as locks
from sparkring.models import ModelPinError, model_pins
from sparkring.profile import load_profile

SIM = {"sim-target": "/srv/sim-model"}


def profile(**keys: str):
    values = {"MODEL_PATH": "/opt/sparkring/models/sim-tiny", "MODEL_REVISION": "sim-tiny-v1"} | keys
    return load_profile(values)


def lock_with_draft():
    data = locks.load_lock().model_dump(mode="json")
    data["models"]["tiny-draft"] = {
        "role": "draft",
        "source": "hub",
        "repository": "example-org/tiny-draft",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "files": [{"path": "model.safetensors", "size": 3, "sha256": "ab" * 32}],
    }
    return locks.Lock.model_validate(data)


def test_the_sim_profile_pins_the_sim_model():
    (pin,) = model_pins(profile(), locks.load_lock(), "sim-target", "", SIM)
    assert pin["role"] == "target" and pin["source"] == "dir" and pin["source_dir"] == "/srv/sim-model"
    assert pin["revision"] == "sim-tiny-v1" and pin["bytes"] == sum(f["size"] for f in pin["files"])


def test_a_draft_without_a_source_comes_from_the_hub():
    pins = model_pins(
        profile(
            DRAFT_PATH="/opt/sparkring/models/draft",
            DRAFT_REVISION="0123456789abcdef0123456789abcdef01234567",
        ),
        lock_with_draft(),
        "sim-target",
        "tiny-draft",
        SIM,
    )
    assert [p["role"] for p in pins] == ["target", "draft"]
    assert pins[1]["source"] == "hub" and pins[1]["repository"] == "example-org/tiny-draft"


@pytest.mark.parametrize(
    ("keys", "target", "draft", "sources", "expected"),
    [
        ({"MODEL_REVISION": "sim-tiny-v2"}, "sim-target", "", SIM,
         "MODEL_REVISION: sim-tiny-v2 in the launch profile, but images/lock.json models.sim-target.revision pins sim-tiny-v1"),
        ({}, "", "", SIM, "model_target: empty"),
        ({}, "glm", "", SIM, "model_target: 'glm' is not among"),
        ({}, "sim-target", "", {}, "model_sources.sim-target"),
        ({}, "sim-target", "", SIM | {"nope": "/x"}, "model_sources: ['nope']"),
        ({}, "sim-target", "sim-target", SIM, "DRAFT_PATH: not set"),
        ({"DRAFT_PATH": "/opt/sparkring/models/sim-tiny/draft", "DRAFT_REVISION": "0123456789abcdef0123456789abcdef01234567"},
         "sim-target", "tiny-draft", SIM, "overlap"),
        ({"DRAFT_PATH": "/d", "DRAFT_REVISION": "0123456789abcdef0123456789abcdef01234567"},
         "sim-target", "sim-target", SIM, "pinned as a target, not a draft"),
    ],
)  # fmt: skip
def test_disagreements_are_refused_naming_both_sides(keys, target, draft, sources, expected):
    with pytest.raises(ModelPinError) as error:
        model_pins(profile(**keys), lock_with_draft(), target, draft, sources)
    assert expected in str(error.value)
