"""A loopback ring for the fan-out protocol tests: N rank agents as threads on 127.77.x.y."""

from __future__ import annotations

import socket
import threading
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_links(fanout, world_size: int, rank: int) -> list:
    """Cable i joins rank i (127.77.i.1) and rank i+1 (127.77.i.2), as in the sim geometry."""
    if world_size == 2:  # a pair shares one cable, cable 0
        return [fanout.Link(1 - rank, f"127.77.0.{rank + 1}", f"127.77.0.{2 - rank}")]
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    return [
        fanout.Link(right, f"127.77.{rank}.1", f"127.77.{rank}.2"),
        fanout.Link(left, f"127.77.{left}.2", f"127.77.{left}.1"),
    ]


class LoopbackRing:
    """N rank agents in threads, each with its own destination directory; rank 0 holds the files
    (one archive, or name -> bytes for a set such as a checkpoint)."""

    def __init__(
        self, fanout, tmp_path: Path, world_size: int, archive: bytes | dict[str, bytes], chunk_size: int
    ) -> None:
        self.fanout = fanout
        self.world_size = world_size
        self.dirs = [tmp_path / f"r{r}" for r in range(world_size)]
        for directory in self.dirs:
            directory.mkdir()
        contents = archive if isinstance(archive, dict) else {"image.tar.zst": archive}
        manifests = []
        for name, data in contents.items():
            source = self.dirs[0] / name
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(data)
            manifests.append(fanout.build_manifest(str(source), chunk_size, name=name))
        self.files = fanout.FileSet(tuple(manifests))
        self.manifest = manifests[0]
        self.port = free_port()

    def path(self, rank: int, name: str | None = None) -> Path:
        return self.dirs[rank] / (name or self.manifest.name)

    def config(self, rank: int, **overrides):
        values = {
            "files": self.files,
            "dest": str(self.dirs[rank]),
            "rank": rank,
            "world_size": self.world_size,
            "links": loopback_links(self.fanout, self.world_size, rank),
            "port": self.port,
            "connect_timeout": 10.0,
            "io_timeout": 10.0,
        }
        values.update(overrides)
        return self.fanout.RankConfig(**values)

    def run(self, overrides: dict | None = None) -> dict:
        """Run every rank at once; returns rank -> Stats or the exception it raised."""
        overrides = overrides or {}
        results: dict = {}

        def one(rank: int) -> None:
            try:
                results[rank] = self.fanout.RankAgent(self.config(rank, **overrides.get(rank, {}))).run()
            except Exception as error:
                results[rank] = error

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results
