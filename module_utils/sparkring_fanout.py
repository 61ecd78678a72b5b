# Copyright: SparkRing contributors. Apache-2.0.
"""Verified, pipelined fan-out of a set of files over the direct ring links (docs/design.md §3.4).

The image stage sends one archive, the model stage every file of a checkpoint: both are a
`FileSet` (sparkring_fanout_manifest.py), assembled on each rank by a `FileStore`
(sparkring_fanout_store.py). This file is the transfer itself: who feeds whom, the wire
protocol and the per-rank agent. Every other rank receives chunks from its ring neighbours only:
ranks on the near half of each side take every chunk from the neighbour towards rank 0, the
antipodal rank takes the even chunks from its left and the odd ones from its right, so both
directions of the ring carry data and no link carries more than the archive once. A relay
forwards each chunk as soon as it is verified, so reaching every rank costs about one link
transfer. Chunks are checked against the manifest (which travels over the management path,
never the data links), bad ones are asked for again, a partial file is renamed only after its
whole sha256 matches, and a restarted transfer keeps every chunk already verified.

Standard library only: this file ships to the nodes with the fan-out modules, and runs as a
script (``python3 sparkring_fanout.py manifest|run``) for benchmarks and tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

try:  # inside an Ansible module
    from ansible.module_utils.sparkring_fanout_manifest import (
        DEFAULT_CHUNK_SIZE,
        FanoutError,
        FileSet,
        Route,
        build_manifest,
    )
    from ansible.module_utils.sparkring_fanout_store import FileStore, check_space, final_state
    from ansible.module_utils.sparkring_geometry import neighbours, world_size_problem
    from ansible.module_utils.sparkring_integrity import write_json_atomic
except ImportError:  # run as a script: module_utils/ is the script's directory, hence on sys.path
    from sparkring_fanout_manifest import DEFAULT_CHUNK_SIZE, FanoutError, FileSet, Route, build_manifest
    from sparkring_fanout_store import FileStore, check_space, final_state
    from sparkring_geometry import neighbours, world_size_problem
    from sparkring_integrity import write_json_atomic

DEFAULT_PORT = 29610
PROTOCOL = "sparkring-fanout/2"
_HEADER = struct.Struct("!I")
_MAX_HEADER = 32 << 20  # a need list of a large checkpoint in 1 MiB chunks fits


def plan_routes(world_size: int, rank: int, source: int = 0) -> tuple[list[Route], list[Route]]:
    """Incoming and outgoing routes of ``rank``: each rank is fed along its shorter side."""
    problem = world_size_problem(world_size)
    if problem:
        raise FanoutError(f"world size {world_size}: {problem}")
    if not 0 <= rank < world_size:
        raise FanoutError(f"rank {rank} outside 0..{world_size - 1}")

    def feeds(r: int) -> list[Route]:
        """Who feeds rank r, expressed as routes whose peer is the feeder."""
        if r == source:
            return []
        clockwise = (r - source) % world_size
        left, right = neighbours(r, world_size)
        if left == right or clockwise < world_size - clockwise:
            return [Route(left)]
        if clockwise > world_size - clockwise:
            return [Route(right)]
        return [Route(left, 2, 0), Route(right, 2, 1)]

    incoming = feeds(rank)
    outgoing = [
        Route(other, route.modulus, route.residue)
        for other in reversed(neighbours(rank, world_size))
        for route in feeds(other)
        if route.peer_rank == rank
    ]
    # On a pair both neighbours are the same rank: one route, not two.
    return incoming, list(dict.fromkeys(outgoing))


@dataclass(frozen=True)
class Link:
    """This rank's end of one ring cable, from the inventory's sparkring_ports."""

    peer_rank: int
    local_address: str
    peer_address: str


@dataclass
class Stats:
    """What happened, returned to Ansible and written to the progress file."""

    resumed_chunks: int = 0
    received_chunks: int = 0
    received_bytes: int = 0
    rejected_chunks: int = 0
    sent_bytes: dict = field(default_factory=dict)
    refused: list = field(default_factory=list)


def send_msg(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    body = json.dumps({**header, "len": len(payload)}).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    view = bytearray(size)
    got = 0
    while got < size:
        read = sock.recv_into(memoryview(view)[got:], size - got)
        if not read:
            raise FanoutError("connection closed by the peer")
        got += read
    return bytes(view)


def recv_msg(sock: socket.socket) -> tuple[dict, bytes]:
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > _MAX_HEADER:
        raise FanoutError(f"protocol header of {length} bytes: not a {PROTOCOL} peer")
    header = json.loads(_recv_exact(sock, length))
    payload = _recv_exact(sock, header["len"]) if header.get("len") else b""
    if header.get("type") == "error":
        raise FanoutError(f"peer refused: {header.get('reason')}")
    return header, payload


@dataclass
class RankConfig:
    """Everything one rank's agent needs; built by the module from inventory hostvars."""

    files: FileSet
    dest: str
    rank: int
    world_size: int
    links: list[Link]
    port: int = DEFAULT_PORT
    connect_timeout: float = 120.0
    io_timeout: float = 60.0
    max_resends: int = 3
    progress_path: str | None = None
    reserve_bytes: int = 0
    max_rate_mbit: int = 0
    fault_corrupt_chunks: frozenset[int] = frozenset()
    # Names the caller already verified in dest (the model stage's record); the rest are hashed.
    complete: frozenset[str] = frozenset()


class RankAgent:
    """One rank's part of a fan-out: listen for its feeders, forward to the ranks it feeds."""

    def __init__(self, config: RankConfig, progress=None) -> None:
        self.config = config
        self.files = config.files
        self.incoming, self.outgoing = plan_routes(config.world_size, config.rank)
        self.stats = Stats()
        self.progress = progress
        self._stats_lock = threading.Lock()
        self._started = time.monotonic()
        self._last_progress = 0.0
        self._conns: list[socket.socket] = []
        self._report_lock = threading.Lock()

    def link_to(self, peer_rank: int) -> Link:
        for link in self.config.links:
            if link.peer_rank == peer_rank:
                return link
        raise FanoutError(
            f"rank {self.config.rank} has no ring port facing rank {peer_rank}; check the inventory ring_ports"
        )

    def held(self) -> frozenset[str]:
        """Names already complete here; a different file under one of the names is refused."""
        held = set(self.config.complete)
        for manifest in self.files.files:
            if manifest.name in held:
                continue
            path = os.path.join(self.config.dest, manifest.name)
            state = final_state(path, manifest)
            if state == "different":
                raise FanoutError(
                    f"rank {self.config.rank}: {path} exists and is not file {manifest.sha256}; "
                    "refusing to overwrite it: move it away or choose another destination"
                )
            if state == "verified":
                held.add(manifest.name)
        return frozenset(held)

    def run(self) -> Stats:
        held = self.held()
        lacking = [m.name for m in self.files.files if m.name not in held]
        if self.config.rank == 0 and lacking:
            raise FanoutError(
                f"rank 0 lacks {lacking[:4]} in {self.config.dest}: it must hold every file before the fan-out"
            )
        if lacking:
            check_space(self.config.dest, self.files, self.config.reserve_bytes, self.config.rank, held)
        store = FileStore(self.files, self.config.dest, held)
        self.stats.resumed_chunks = store.resumed
        self._report(store, force=True)  # a follower sees this run's state, not the last run's
        listeners = [self._listen(self.link_to(route.peer_rank)) for route in self.incoming]
        threads = [
            threading.Thread(target=self._guard, args=(store, self._receive, sock, route), daemon=True)
            for sock, route in zip(listeners, self.incoming, strict=True)
        ] + [
            threading.Thread(target=self._guard, args=(store, self._send, route), daemon=True)
            for route in self.outgoing
        ]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if store.failure is not None:
                raise store.failure
            if not store.complete:
                store.finalize()
        finally:
            for sock in listeners:
                sock.close()
            store.close()
            self._report(store, force=True)
        return self.stats

    def _guard(self, store: FileStore, work, *args) -> None:
        try:
            work(store, *args)
        except BaseException as error:  # any failure stops every thread of this rank
            store.abort(error)
            with self._stats_lock:
                for conn in self._conns:
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)

    def _track(self, conn: socket.socket) -> socket.socket:
        """Remember a connection so a failure elsewhere can unblock it at once."""
        with self._stats_lock:
            self._conns.append(conn)
        return conn

    def _listen(self, link: Link) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((link.local_address, self.config.port))
        except OSError as error:
            sock.close()
            raise FanoutError(
                f"rank {self.config.rank}: cannot listen on {link.local_address}:{self.config.port} "
                f"({error.strerror}); is another fan-out running, or is the port taken?"
            ) from error
        sock.listen(4)
        return sock

    def _accept_neighbour(self, store: FileStore, listener: socket.socket, link: Link) -> socket.socket:
        """Wait for the feeder; anything else that connects is refused and recorded."""
        deadline = time.monotonic() + self.config.connect_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or store.failure is not None:
                raise FanoutError(
                    f"rank {self.config.rank}: rank {link.peer_rank} never connected from {link.peer_address} "
                    f"within {self.config.connect_timeout:.0f}s; is the fan-out running there?"
                )
            listener.settimeout(min(left, 1.0))
            try:
                conn, (address, _port) = listener.accept()
            except TimeoutError:
                continue
            if address == link.peer_address:
                conn.settimeout(self.config.io_timeout)
                return self._track(conn)
            reason = (
                f"rank {self.config.rank} accepts fan-out data on {link.local_address} only from its ring "
                f"neighbour rank {link.peer_rank} at {link.peer_address}, not from {address}"
            )
            with self._stats_lock:
                self.stats.refused.append({"address": address, "reason": reason})
            with contextlib.suppress(OSError):
                send_msg(conn, {"type": "error", "reason": reason})
            conn.close()

    def _receive(self, store: FileStore, listener: socket.socket, route: Route) -> None:
        link = self.link_to(route.peer_rank)
        conn = self._accept_neighbour(store, listener, link)
        edge = f"rank {route.peer_rank} -> rank {self.config.rank}"
        with conn:
            hello, _ = recv_msg(conn)
            if hello.get("protocol") != PROTOCOL or hello.get("sha256") != self.files.digest:
                reason = f"{edge}: offered {hello.get('sha256')}, this rank expects {self.files.digest}"
                send_msg(conn, {"type": "error", "reason": reason})
                raise FanoutError(reason)
            for attempt in range(self.config.max_resends + 2):
                need = store.missing(route)
                if need and attempt > self.config.max_resends:
                    break
                send_msg(conn, {"type": "need", "chunks": need})
                if not need:
                    return
                while True:
                    header, payload = recv_msg(conn)
                    if header["type"] == "end":
                        break
                    if store.put(header["index"], payload):
                        with self._stats_lock:
                            self.stats.received_chunks += 1
                            self.stats.received_bytes += len(payload)
                    else:
                        with self._stats_lock:
                            self.stats.rejected_chunks += 1
                    self._report(store)
            names = sorted({self.files.files[self.files.locate(i)[0]].name for i in need[:8]})
            reason = (
                f"{edge}: chunks {need[:8]} (of {', '.join(names)}) failed verification "
                f"{self.config.max_resends + 1} times; check the link and the files on rank {route.peer_rank}"
            )
            send_msg(conn, {"type": "error", "reason": reason})
            raise FanoutError(reason)

    def _connect(self, link: Link) -> socket.socket:
        deadline = time.monotonic() + self.config.connect_timeout
        while True:
            try:
                return self._track(
                    socket.create_connection(
                        (link.peer_address, self.config.port),
                        timeout=self.config.io_timeout,
                        source_address=(link.local_address, 0),
                    )
                )
            except OSError as error:
                if time.monotonic() >= deadline:
                    raise FanoutError(
                        f"rank {self.config.rank} cannot reach rank {link.peer_rank} at "
                        f"{link.peer_address}:{self.config.port} ({error}); is the fan-out running there?"
                    ) from error
                time.sleep(0.2)

    def _send(self, store: FileStore, route: Route) -> None:
        link = self.link_to(route.peer_rank)
        edge = f"rank {self.config.rank} -> rank {route.peer_rank}"
        corrupt = set(self.config.fault_corrupt_chunks)
        # Optional pacing (leave room for serving traffic): bytes this link may have sent by now.
        rate = self.config.max_rate_mbit * 125_000
        started, paced = time.monotonic(), 0
        with self._connect(link) as conn:
            send_msg(conn, {"type": "hello", "protocol": PROTOCOL, "sha256": self.files.digest})
            while True:
                header, _ = recv_msg(conn)
                pending = set(header["chunks"])
                if not pending:
                    return
                while pending:
                    index = store.next_available(pending, self.config.io_timeout)
                    pending.discard(index)
                    data = store.read(index)
                    if index in corrupt:  # fault injection for tests: flip one byte, once
                        corrupt.discard(index)
                        data = bytes([data[0] ^ 0xFF]) + data[1:]
                    try:
                        send_msg(conn, {"type": "chunk", "index": index}, data)
                    except OSError as error:
                        raise FanoutError(f"{edge}: {error}") from error
                    with self._stats_lock:
                        key = str(route.peer_rank)
                        self.stats.sent_bytes[key] = self.stats.sent_bytes.get(key, 0) + len(data)
                    if rate:
                        paced += len(data)
                        time.sleep(max(0.0, started + paced / rate - time.monotonic()))
                send_msg(conn, {"type": "end"})

    def _report(self, store: FileStore, force: bool = False) -> None:
        with self._report_lock:  # receiver threads report concurrently; one writer at a time
            self._report_locked(store, force)

    def _report_locked(self, store: FileStore, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < 0.5:
            return
        self._last_progress = now
        with store.cond:
            have = len(store.have)
        with self._stats_lock:
            state = {
                "rank": self.config.rank,
                "phase": "transfer",
                "pid": os.getpid(),
                "files": self.files.label,
                "chunks_verified": have,
                "chunks_total": store.count,
                "percent": round(100.0 * have / store.count, 1),
                "received_bytes": self.stats.received_bytes,
                "resumed_chunks": self.stats.resumed_chunks,
                "elapsed_s": round(now - self._started, 2),
                "rejected_chunks": self.stats.rejected_chunks,
            }
        if self.config.progress_path:
            write_json_atomic(self.config.progress_path, state)
        if self.progress is not None:
            self.progress(state)


def config_from_dict(data: dict) -> RankConfig:
    return RankConfig(
        files=FileSet.from_list(data["files"]),
        dest=data["dest"],
        rank=int(data["rank"]),
        world_size=int(data["world_size"]),
        links=[Link(**link) for link in data["links"]],
        port=int(data.get("port", DEFAULT_PORT)),
        connect_timeout=float(data.get("connect_timeout", 120.0)),
        io_timeout=float(data.get("io_timeout", 60.0)),
        max_resends=int(data.get("max_resends", 3)),
        progress_path=data.get("progress_path"),
        reserve_bytes=int(data.get("reserve_bytes", 0)),
        max_rate_mbit=int(data.get("max_rate_mbit", 0)),
        fault_corrupt_chunks=frozenset(data.get("fault_corrupt_chunks", ())),
        complete=frozenset(data.get("complete", ())),
    )


# The transfer options both fan-out modules (sparkring_image_fanout, sparkring_model) take, as
# argument_spec entries; plugins/doc_fragments/sparkring_fanout.py documents them. Each module adds
# its own `port` (default) and `reserve_bytes` (what must stay free where, differs per module).
TRANSFER_OPTIONS: dict[str, dict] = {
    "rank": {"type": "int"},
    "world_size": {"type": "int"},
    "ports": {"type": "list", "elements": "dict"},
    "transfer": {"type": "bool", "default": True},
    "connect_timeout": {"type": "int", "default": 120},
    "io_timeout": {"type": "int", "default": 60},
    "max_resends": {"type": "int", "default": 3},
    "max_rate_mbit": {"type": "int", "default": 0},
    "fault_corrupt_chunks": {"type": "list", "elements": "int", "default": []},
}


def rank_config(
    params: dict, files: FileSet, dest: str, progress_path: str, complete: frozenset[str] = frozenset()
) -> RankConfig:
    """This rank's agent from a fan-out module's parameters (TRANSFER_OPTIONS, port, reserve_bytes):
    the links are the inventory's ring ports (sparkring_ports), one per neighbour."""
    return RankConfig(
        files=files,
        dest=dest,
        rank=params["rank"],
        world_size=params["world_size"],
        links=[
            Link(int(port["peer_rank"]), str(port["address"]), str(port["peer_address"]))
            for port in params["ports"] or []
        ],
        port=params["port"],
        connect_timeout=float(params["connect_timeout"]),
        io_timeout=float(params["io_timeout"]),
        max_resends=params["max_resends"],
        progress_path=progress_path,
        reserve_bytes=params["reserve_bytes"],
        max_rate_mbit=params["max_rate_mbit"],
        fault_corrupt_chunks=frozenset(params["fault_corrupt_chunks"]),
        complete=complete,
    )


def transfer_result(stats: Stats) -> dict:
    """What a fan-out module returns about its transfer (Stats() for a run that moved nothing);
    both modules' RETURN document exactly these keys (tests/unit/image keeps them equal)."""
    return {
        "received_bytes": stats.received_bytes,
        "resumed_chunks": stats.resumed_chunks,
        "rejected_chunks": stats.rejected_chunks,
        "sent_bytes": stats.sent_bytes,
        "refused": stats.refused,
    }


def _main(argv: list[str]) -> int:
    """``manifest FILE [CHUNK_SIZE]`` prints a manifest; ``run`` reads a RankConfig as JSON on stdin."""
    if len(argv) >= 2 and argv[0] == "manifest":
        size = int(argv[2]) if len(argv) > 2 else DEFAULT_CHUNK_SIZE
        print(json.dumps(build_manifest(argv[1], size).to_dict()))
        return 0
    if argv == ["run"]:
        config = config_from_dict(json.load(sys.stdin))
        try:
            stats = RankAgent(config, progress=lambda s: print(json.dumps(s), file=sys.stderr)).run()
        except (FanoutError, OSError) as error:
            print(json.dumps({"failed": True, "msg": str(error)}))
            return 1
        print(json.dumps({"failed": False, **asdict(stats)}))
        return 0
    print("usage: sparkring_fanout.py manifest FILE [CHUNK_SIZE] | run < config.json", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
