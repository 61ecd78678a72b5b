# Copyright: SparkRing contributors. Apache-2.0.
"""Docker and zstd plumbing of the image fan-out: export, load and identity, stdlib only.

Pipes run as real processes (docker save | zstd, zstd -dc | docker load), never through a shell.
"""

from __future__ import annotations

import os
import subprocess
import threading


class DockerError(Exception):
    """A docker or zstd step failed; the message carries the command and its stderr."""


def _env(docker_host: str | None) -> dict:
    env = {**os.environ, "LANG": "C", "LC_ALL": "C"}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return env


def _run(argv: list[str], docker_host: str | None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(docker_host), check=False)
    if proc.returncode != 0:
        raise DockerError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def image_id(docker: str, ref: str, docker_host: str | None) -> str | None:
    """The local image ID (config digest) that ``ref`` names, or None when absent."""
    proc = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", ref],
        capture_output=True,
        text=True,
        env=_env(docker_host),
        check=False,
    )
    if proc.returncode == 0:
        return proc.stdout.strip()
    if "No such image" in proc.stderr or "No such object" in proc.stderr:
        return None
    raise DockerError(f"docker image inspect {ref} exited {proc.returncode}: {proc.stderr.strip()}")


def image_size(docker: str, ref: str, docker_host: str | None) -> int:
    return int(_run([docker, "image", "inspect", "--format", "{{.Size}}", ref], docker_host))


def root_dir(docker: str, docker_host: str | None) -> str:
    return _run([docker, "info", "--format", "{{.DockerRootDir}}"], docker_host)


def _pipe(first: list[str], second: list[str], docker_host: str | None, sink=None) -> None:
    """first | second, both checked; the consumer's output goes to sink(bytes) block by block."""
    env = _env(docker_host)
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


def export_image(docker: str, zstd: str, ref: str, level: int, docker_host: str | None, sink) -> None:
    """docker save REF | zstd, each compressed block handed to sink (a file, a hasher, or both)."""
    _pipe([docker, "save", ref], [zstd, f"-{level}", "-T0", "-q", "-c"], docker_host, sink)


def load_archive(docker: str, zstd: str, path: str, docker_host: str | None) -> None:
    """zstd -dc archive | docker load."""
    _pipe([zstd, "-dc", "-q", path], [docker, "load", "-q"], docker_host)
