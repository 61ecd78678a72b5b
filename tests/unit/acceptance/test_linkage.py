"""module_utils/sparkring_linkage.py on real processes: two copies of a library named libnccl.so.2,
built here with gcc, loaded the ways a vLLM process can load them (LD_PRELOAD, dlopen by path,
a DT_NEEDED dependency), and the inspector must say which copy each process really uses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.sparkring_linkage import LibraryUse, identity_verdict, sha256_file

NCCL = "int ncclGetVersion(int *v) {{ *v = {version}; return 0; }}\nint ncclCommCount(void) {{ return 0; }}\n"
CONSUMER = (
    "extern int ncclGetVersion(int *v);\nint consume(void) { int v = 0; ncclGetVersion(&v); return v; }\n"
)
# The child loads what its argv says, in order, calls consume() when asked, prints what it got,
# then waits on stdin so the test can read its /proc while it lives.
CHILD = r"""
import ctypes, sys
consumer = None
for step in sys.argv[1:]:
    kind, _, path = step.partition("=")
    if kind == "global":
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    elif kind == "local":
        ctypes.CDLL(path)
    elif kind == "consumer":
        consumer = ctypes.CDLL(path)
    elif kind == "call":
        print(consumer.consume(), flush=True)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (requirements-apt.txt): the test builds its libraries")
    top = tmp_path_factory.mktemp("linkage")
    out = {}
    for name, version in (("attested", 22907), ("bundled", 22809)):
        (top / name).mkdir()
        src = top / f"{name}.c"
        src.write_text(NCCL.format(version=version))
        out[name] = top / name / "libnccl.so.2"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", out[name], src], check=True
        )
    (top / "consumer.c").write_text(CONSUMER)
    out["consumer"] = top / "libconsumer.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", out["consumer"], top / "consumer.c", out["attested"]], check=True
    )
    return out


class Child:
    def __init__(self, steps: list[str], preload: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if preload:
            env["LD_PRELOAD"] = str(preload)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *steps],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines = []
        while (line := self.proc.stdout.readline().strip()) != "ready":
            assert line, "the child exited early"
            self.lines.append(line)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def inspect(child: Child) -> dict:
    report = LibraryUse("libnccl", "nccl").inspect(child.proc.pid)
    return {**report, "title": "child"}


def test_preloaded_copy_wins_and_the_second_copy_is_proven_unused(libs) -> None:
    steps = [f"local={libs['bundled']}", f"consumer={libs['consumer']}", "call"]
    with Child(steps, preload=libs["attested"]) as child:
        report = inspect(child)
    assert child.lines == ["22907"]  # the process really called the preloaded copy
    assert {lib["path"] for lib in report["libraries"]} == {str(libs["attested"]), str(libs["bundled"])}
    assert report["first_by_soname"] == {"libnccl.so.2": str(libs["attested"])}
    bound = [b for b in report["bindings"] if b["symbol"] == "ncclGetVersion"]
    assert bound == [
        {
            "object": str(libs["consumer"]),
            "symbol": "ncclGetVersion",
            "state": "bound",
            "target": str(libs["attested"]),
        }
    ]
    verdict = identity_verdict([report], sha256_file(libs["attested"]))
    assert verdict == {"status": "pass", "mode": "second-proven-unused", "problems": []}


def test_a_slot_bound_into_the_other_copy_fails_naming_it(libs) -> None:
    steps = [f"global={libs['bundled']}", f"consumer={libs['consumer']}", "call", f"local={libs['attested']}"]
    with Child(steps) as child:
        report = inspect(child)
    assert child.lines == ["22809"]
    verdict = identity_verdict([report], sha256_file(libs["attested"]))
    assert verdict["status"] == "fail"
    assert any(f"find {libs['bundled']} first" in p for p in verdict["problems"]), verdict
    assert any(f"binds ncclGetVersion to {libs['bundled']}" in p for p in verdict["problems"]), verdict


def test_a_slot_not_called_yet_is_reported_unbound(libs) -> None:
    steps = [f"local={libs['bundled']}", f"consumer={libs['consumer']}"]
    with Child(steps, preload=libs["attested"]) as child:
        report = inspect(child)
    states = {b["state"] for b in report["bindings"] if b["symbol"] == "ncclGetVersion"}
    assert states <= {"unbound", "bound"} and states  # lazy binding, or bound at load (-z now)
    assert identity_verdict([report], sha256_file(libs["attested"]))["status"] == "pass"


def test_only_the_attested_copy_mapped(libs) -> None:
    with Child([f"consumer={libs['consumer']}", "call"], preload=libs["attested"]) as child:
        report = inspect(child)
    assert [lib["sha256"] for lib in report["libraries"]] == [sha256_file(libs["attested"])]
    assert identity_verdict([report], sha256_file(libs["attested"]))["mode"] == "single"
    other = identity_verdict([report], "0" * 64)
    assert other["status"] == "fail" and "does not map the attested library" in other["problems"][0]


def test_no_nccl_attested_and_none_mapped_passes_a_preloaded_one_fails(libs) -> None:
    with Child([]) as child:
        assert identity_verdict([inspect(child)], None) == {"status": "pass", "mode": "none", "problems": []}
    with Child([], preload=libs["bundled"]) as child:
        verdict = identity_verdict([inspect(child)], None)
    assert verdict["status"] == "fail"
    assert f"maps {libs['bundled']} (sha256 {sha256_file(libs['bundled'])})" in verdict["problems"][0]
    assert "attests no NCCL library" in verdict["problems"][0]
