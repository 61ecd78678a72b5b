# Copyright: SparkRing contributors. Apache-2.0.
"""The one way a module reaches a rank's Docker daemon: the docker CLI through run_command.

The binary is found once, `DOCKER_HOST` comes from the module's `docker_host` option (documented
by the sparkring_docker doc fragment), and every call runs with LANG=C. Streams a module consumes
block by block (`docker save | zstd`, `zstd -dc | docker load`) are piped as real processes,
never through a shell. Standard library only: it ships to the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

# The argument spec entry every Docker-using module takes (doc fragment: sparkring_docker).
DOCKER_HOST_OPTION = {"docker_host": {"type": "str", "default": ""}}

_MISSING = ("No such container", "No such image", "No such object")


class DockerError(Exception):
    """A docker (or zstd) step failed; the message carries the command and its stderr."""


class Docker:
    """One daemon as a module sees it: `run`, `inspect`, `pids`, `ping`, `pipe`."""

    def __init__(self, module, docker_host: str | None = None) -> None:
        self.module = module
        self.binary = module.get_bin_path("docker", required=True)
        host = module.params.get("docker_host", "") if docker_host is None else docker_host
        self.env = {"LANG": "C", "LC_ALL": "C", **({"DOCKER_HOST": host} if host else {})}

    def run(self, *args: str, check: bool = False, env: dict | None = None) -> tuple[int, str, str]:
        """`docker ARGS`; with `check`, a non-zero exit raises DockerError naming the command."""
        rc, out, err = self.module.run_command(
            [self.binary, *args], environ_update={**self.env, **(env or {})}
        )
        if check and rc != 0:
            raise DockerError(f"docker {' '.join(args[:2])} exited {rc}: {err.strip() or out.strip()}")
        return rc, out, err

    def inspect(self, name: str, kind: str = "container") -> dict | None:
        """The object's inspect record, or None when no such object exists (any other failure raises)."""
        rc, out, err = self.run(kind, "inspect", name)
        if rc == 0:
            return json.loads(out)[0]
        if any(marker in err for marker in _MISSING) or not err.strip():
            return None
        raise DockerError(f"docker {kind} inspect {name} exited {rc}: {err.strip()}")

    def pids(self, container: str) -> list[int]:
        """Host PIDs of every process in a running container (`docker top`)."""
        rc, out, err = self.run("top", container, "-eo", "pid")
        if rc != 0:
            raise DockerError(f"docker top {container} failed ({err.strip()}); is the deployment running?")
        return [int(line) for line in out.split()[1:] if line.isdigit()]

    def ping(self) -> str:
        """The daemon's server version; raises DockerError when it does not answer."""
        rc, out, err = self.run("version", "--format", "{{.Server.Version}}")
        if rc != 0 or not out.strip():
            raise DockerError(f"the Docker daemon does not answer: {err.strip() or 'no server version'}")
        return out.strip()

    def pipe(self, first: list[str], second: list[str], sink=None) -> None:
        """first | second as real processes, both checked; the consumer's output goes to sink(bytes)."""
        env = {**os.environ, **self.env}
        producer = subprocess.Popen(first, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        consumer = subprocess.Popen(
            second, stdin=producer.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        producer.stdout.close()  # the consumer owns the pipe now; SIGPIPE reaches the producer
        # stderr is drained by a thread so neither process can block on a full pipe
        errors: dict = {}
        readers = [
            threading.Thread(target=lambda p=proc, k=key: errors.update({k: p.stderr.read()}))
            for key, proc in (("first", producer), ("second", consumer))
        ]
        for reader in readers:
            reader.start()
        for block in iter(lambda: consumer.stdout.read(1 << 20), b""):
            if sink is not None:
                sink(block)
        consumer.wait()
        producer.wait()
        for reader in readers:
            reader.join()
        for key, argv, proc in (("first", first, producer), ("second", second, consumer)):
            if proc.returncode != 0:
                text = errors.get(key, b"").decode(errors="replace").strip()
                raise DockerError(f"{' '.join(argv)} exited {proc.returncode}: {text}")


def read_cmdline(pid: int, limit: int = 400) -> str:
    """A process's command line as one string (its title, for vLLM's renamed workers)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read(limit).replace(b"\0", b" ").decode(errors="replace").strip()
