"""Liveness of the ring's links: the heartbeat, the dead-peer bound, and the verdict.

Every communicator runs a keeper thread that sends a heartbeat on each link when nothing else
went for ``heartbeat_s`` and declares a neighbour dead when its link closes (at once) or nothing
came from it for ``dead_after_s``, whether or not a collective runs: on tcp natively
(csrc/sr_engine.c ``sr_keeper``), whose first verdict is sent on around the ring, so every rank
names the rank that failed and every collective on the communicator fails with it; on verbs a
thread that gives each idle link its turn in the engine (``PollingKeeper``).

The one place these settings live: ``SPARKRING_HEARTBEAT_S`` (default 1 s) and
``SPARKRING_DEAD_AFTER_S`` (default 5 s) in the environment of every rank's process.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from transport._native import KEEPER_PEERS, SrDead, SrError
from transport.errors import PeerClosedError, PeerTimeoutError, TransportError

HEARTBEAT_S = 1.0
DEAD_AFTER_S = 5.0
SR_ETIMEOUT, SR_ECLOSED = 1, 2


@dataclass(frozen=True)
class Liveness:
    """How often a link says it is there, and how long a silent one has until it is dead."""

    heartbeat_s: float = HEARTBEAT_S
    dead_after_s: float = DEAD_AFTER_S

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.dead_after_s:
            raise ValueError(
                f"SPARKRING_HEARTBEAT_S={self.heartbeat_s} must be positive and below "
                f"SPARKRING_DEAD_AFTER_S={self.dead_after_s} (defaults {HEARTBEAT_S} and {DEAD_AFTER_S})"
            )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Liveness:
        env = os.environ if env is None else env
        return cls(
            float(env.get("SPARKRING_HEARTBEAT_S", HEARTBEAT_S)),
            float(env.get("SPARKRING_DEAD_AFTER_S", DEAD_AFTER_S)),
        )


@dataclass(frozen=True)
class Verdict:
    """A dead rank, the cable it was seen on, when, and who saw it (first-hand or told)."""

    dead_rank: int
    reporter: int  # the rank at the cable's other end, which saw it first-hand
    via: int | None  # the neighbour that told this rank; None: this rank saw it itself
    cage: int
    address: str | None
    closed: bool  # its connection closed (else: nothing heard for silent_s)
    silent_s: float
    at: datetime

    @classmethod
    def from_native(cls, d: SrDead, via: int) -> Verdict:
        address = str(ipaddress.IPv4Address(d.addr.to_bytes(4, "little"))) if d.addr else None
        at = datetime.fromtimestamp(d.at_ms / 1000, UTC)
        return cls(
            d.dead_rank,
            d.reporter,
            via if via >= 0 else None,
            d.cage,
            address,
            d.code == SR_ECLOSED,
            d.silent_ms / 1000,
            at,
        )

    @property
    def cable(self) -> str:
        return f"r{self.reporter} cage{self.cage} <-> r{self.dead_rank} cage{self.cage}"

    def describe(self) -> str:
        """``rank 2 (198.19.1.2, r1 cage1 <-> r2 cage1) stopped answering at <UTC> (why; who)``."""
        where = f"{self.address}, {self.cable}" if self.address else self.cable
        why = "its connection closed" if self.closed else f"nothing heard for {self.silent_s:.1f} s"
        told = f"; reported by rank {self.reporter}" + (
            f" via rank {self.via}" if self.via != self.reporter else ""
        )
        when = self.at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.at.microsecond // 1000:03d}Z"
        return f"rank {self.dead_rank} ({where}) stopped answering at {when} ({why}{told if self.via is not None else ''})"

    def error(self, prefix: str, collective: str | None) -> TransportError:
        """The communicator's error: PeerClosedError or PeerTimeoutError naming the dead rank."""
        cls = PeerClosedError if self.closed else PeerTimeoutError
        suffix = f" [peer rank {self.dead_rank} at {self.address}, cage {self.cage}]" if self.address else ""
        return cls(f"{prefix}{self.describe()}{suffix}", self.dead_rank, collective)


class PollingKeeper:
    """The verbs fabric's keeper: a thread that gives each idle link its turn in the engine.

    ``keepalive(handle, heartbeat_ms, dead_ms, err)`` is the engine's ``sr_vlink_keepalive``
    (csrc/sr_verbs.c): it drains the link's completions, sends a heartbeat (a repeated ack) when
    nothing went for heartbeat_ms, and returns 1 while a call holds the link, 0, or a negative
    status naming the peer that sent nothing for dead_ms. The first failure is this rank's
    verdict (the ctypes call leaves the GIL, so this costs the collectives nothing). Verbs has no
    DEAD frames: a verdict is not passed on, the other ranks see this one leave.
    """

    def __init__(self, keepalive: Any, rank: int, links: list[Any], liveness: Liveness) -> None:
        self.keepalive, self.rank, self.links, self.liveness = keepalive, rank, links, liveness
        self._verdict: Verdict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkring-verbs-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        hb_ms, dead_ms = int(self.liveness.heartbeat_s * 1000), int(self.liveness.dead_after_s * 1000)
        while not self._stop.wait(self.liveness.heartbeat_s / 4):
            for link in self.links:
                err = SrError()
                rc = self.keepalive(link.handle, hb_ms, dead_ms, ctypes.byref(err))
                if rc < 0:
                    at = datetime.now(UTC)
                    closed = -rc == SR_ECLOSED
                    silent = 0.0 if closed else self.liveness.dead_after_s
                    self._verdict = Verdict(
                        link.peer_rank, self.rank, None, link.cage, link.address, closed, silent, at
                    )
                    return

    def verdict(self) -> Verdict | None:
        return self._verdict

    def close(self) -> None:
        """Stop the thread (idempotent); it must stop before the links are freed."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class Keeper:
    """The native keeper thread of one communicator's tcp links (see the module docstring)."""

    def __init__(self, lib: Any, links: list[Any], liveness: Liveness) -> None:
        self.lib, self.liveness = lib, liveness
        for link in links:
            addr = int.from_bytes(ipaddress.IPv4Address(link.address).packed, "little")
            lib.sr_peer_describe(link.handle, addr, link.cage)
        handles = (ctypes.c_void_p * len(links))(*(link.handle.value for link in links))
        self.handle = lib.sr_keeper_new(
            handles, len(links), int(liveness.heartbeat_s * 1000), int(liveness.dead_after_s * 1000)
        )
        if not self.handle:
            raise ValueError(f"the keeper refused {len(links)} links or {liveness}")
        if lib.sr_keeper_start(self.handle):
            lib.sr_keeper_free(self.handle)
            raise TransportError("could not start the link keeper thread")
        self.count = len(links)
        self._last: Verdict | None = None
        self._lock = threading.Lock()

    def verdict(self) -> Verdict | None:
        """The first verdict on this communicator (kept after close). Any thread may ask (the
        overlay's watch does while a collective fails and closes): the lock keeps it off a freed keeper."""
        with self._lock:
            return self._native_verdict() if self.handle else self._last

    def _native_verdict(self) -> Verdict | None:
        d, via = SrDead(), ctypes.c_int()
        if not self.lib.sr_keeper_verdict(self.handle, ctypes.byref(d), ctypes.byref(via)):
            return None
        return Verdict.from_native(d, via.value)

    def silence_s(self) -> list[float]:
        """Seconds since each link last heard from its peer (link order)."""
        out = (ctypes.c_int64 * KEEPER_PEERS)()
        with self._lock:
            if self.handle:
                self.lib.sr_keeper_silence_ms(self.handle, ctypes.byref(out))
        return [out[i] / 1000 for i in range(self.count)]

    def close(self) -> None:
        """Stop the thread (idempotent); it must stop before the links are freed."""
        with self._lock:
            if self.handle:
                self._last = self._native_verdict()
                self.lib.sr_keeper_free(self.handle)
                self.handle = None
