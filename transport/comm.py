"""The ring communicator: collectives over a rank's two ring links.

Each collective is a fixed sequence of native transfers (transport.schedule), each one a
single call into the engine that sends to one neighbour while it receives from one. One
deadline bounds the whole collective; the first failure closes every link (so the
neighbours fail fast instead of waiting out their bound) and raises an error naming the
peer and the collective. A failed communicator stays failed.

Between and during collectives a keeper thread watches every link (transport.liveness): a
neighbour that dies is noticed within the dead-peer bound even on an idle ring, and the
verdict, passed around the ring, names the rank that failed on every rank.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from transport import schedule
from transport._native import SrError, SrLane
from transport.buffers import HostBuffer, as_host_buffer
from transport.errors import NATIVE_ERRORS, TransportError
from transport.fabric_tcp import DEFAULT_CONNECTIONS, DEFAULT_STRIPE_MIN_BYTES, TcpFabric
from transport.liveness import Liveness, Verdict
from transport.plan import ADD, COPY
from transport.portable_math import exp_nonpositive, log_positive
from transport.rendezvous import rendezvous
from transport.topology import RingSpec

Lane = tuple[int | None, np.ndarray | None, int | None, np.ndarray | None]  # to, send, frm, recv
DEFAULT_TCP_PORT = 18600


class Communicator:
    """Collectives for one rank of the ring (``fabric`` ``tcp`` or ``verbs``).

    ``connections`` (tcp; None: the fabric's default): TCP connections per link; a transfer of at
    least ``stripe_min_bytes`` each way is cut over all of them (transport.fabric_tcp).
    """

    def __init__(
        self,
        spec: RingSpec,
        *,
        fabric: str = "tcp",
        tcp_port: int = DEFAULT_TCP_PORT,
        timeout_s: float = 30.0,
        setup_timeout_s: float = 60.0,
        slot_bytes: int = 256 * 1024,
        window: int = 16,
        liveness: Liveness | None = None,
        connections: int | None = None,
        stripe_min_bytes: int = DEFAULT_STRIPE_MIN_BYTES,
    ) -> None:
        self.spec, self.rank, self.world = spec, spec.rank, spec.world
        self.timeout_s = timeout_s
        self._failure: TransportError | None = None
        self._driver: Any = None  # a CommandRing that owns the links while attached
        self._scratch_buf = np.empty(0, dtype=np.uint8)
        if fabric == "tcp":
            tcp_connections = DEFAULT_CONNECTIONS if connections is None else connections
            self.fabric: Any = TcpFabric(slot_bytes, window, tcp_connections, stripe_min_bytes)
        elif fabric == "verbs":
            if connections not in (None, 1):
                raise ValueError(
                    f"connections {connections}: verbs stripes over the port's twins, not connections"
                )
            from transport.fabric_verbs import VerbsFabric

            self.fabric = VerbsFabric(spec, slot_bytes, window)
        else:
            raise ValueError(f"unknown fabric {fabric!r}: tcp or verbs")
        edges = rendezvous(
            spec,
            tcp_port,
            setup_timeout_s,
            lambda port, d: self.fabric.record(spec, port, d),
            self.fabric.connection_per_twin,
        )
        self.links = self.fabric.open(spec, edges)
        self.liveness = liveness or Liveness.from_env()
        self.keeper = self.fabric.watch(list(self.links.values()), self.liveness)

    # -- plumbing -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every link (idempotent); neighbours see the connection close.

        A healthy communicator first waits (within ``timeout_s``) for its neighbours to
        acknowledge what it sent; a failed one closes at once so they fail fast.
        """
        if self._driver is not None:
            self._driver.close()  # its progress thread must stop before the links go
        if self.keeper is not None:
            self.keeper.close()  # so must the keeper
        linger = 0.0 if self._failure is not None or self.verdict() is not None else self.timeout_s
        for link in self.links.values():
            self.fabric.close(link, linger)
        self.links = {}

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verdict(self) -> Verdict | None:
        """The ring's dead-peer verdict (this rank's own or one a neighbour sent), once there is one."""
        return self.keeper.verdict() if self.keeper is not None else None

    def stats(self) -> dict[int, dict[str, int]]:
        """Per-neighbour frame and byte counters of the engine."""
        return {peer: self.fabric.stats(link) for peer, link in self.links.items()}

    def _begin(self, collective: str) -> float:
        verdict = self.verdict()
        if self._failure is None and verdict is not None:
            self._failure = verdict.error(f"{collective} on rank {self.rank}: ", collective)
            self.close()
            raise self._failure
        if self._failure is not None:
            raise TransportError(
                f"{collective}: communicator failed earlier: {self._failure}", collective=collective
            )
        if not self.links:
            raise TransportError(f"{collective}: communicator is closed", collective=collective)
        if self._driver is not None:
            raise TransportError(
                f"{collective}: this communicator's links are driven by its command ring; post through it",
                collective=collective,
            )
        return time.monotonic() + self.timeout_s

    def attach_driver(self, driver: Any) -> None:
        """Hand the links to a command ring (transport.command_ring) until it detaches."""
        if self._driver is not None:
            raise TransportError("this communicator already has a command ring")
        self._begin("attach")
        self._driver = driver

    def detach_driver(self, driver: Any) -> None:
        if self._driver is driver:
            self._driver = None

    def transfer(
        self,
        collective: str,
        deadline: float,
        to: int | None,
        send: np.ndarray | None,
        frm: int | None,
        recv: np.ndarray | None,
        op: int = COPY,
        code: int = 0,
    ) -> None:
        """Point-to-point step: send ``send`` to rank ``to`` while receiving ``recv`` from ``frm``.

        ``op`` ADD adds the incoming elements (dtype ``code``) into ``recv``. Either side may
        be None. The collectives are sequences of these; the probe uses it directly.
        """
        self.transfer_lanes(collective, deadline, [(to, send, frm, recv)], op, code)

    def transfer_lanes(self, collective: str, deadline: float, lanes: list[Lane], op: int, code: int) -> None:
        """Several (to, send, frm, recv) transfers in one engine call, all progressing at once.

        Lanes that share a neighbour use it in lane order, and both ends must list them in
        the same order (a two-rank ring's halves both go over its one cable).
        """
        arr = (SrLane * len(lanes))()
        for slot, (to, send, frm, recv) in zip(arr, lanes, strict=True):
            if to is not None and send is not None:
                slot.to, slot.sbuf, slot.slen = self.links[to].handle.value, send.ctypes.data, send.nbytes
            if frm is not None and recv is not None:
                slot.frm, slot.rbuf, slot.rlen = self.links[frm].handle.value, recv.ctypes.data, recv.nbytes
        err = SrError()
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        rc = self.fabric.transfer_lanes(arr, len(lanes), op, code, left_ms, ctypes.byref(err))
        if rc != 0:
            self.fail_from(collective, err)

    def fail_from(self, collective: str, err: SrError) -> None:
        """Mark the communicator failed with the engine's error, close every link, raise it.

        A dead-peer verdict, when the ring has one, is the error: it names the rank that failed.
        """
        peer = err.peer_rank if err.peer_rank >= 0 else None
        where = ""
        if peer in self.links:
            link = self.links[peer]
            where = f" [peer rank {peer} at {link.address}, cage {link.cage}]"
        cls = NATIVE_ERRORS.get(err.code, TransportError)
        verdict = self.verdict()
        if verdict is not None:
            exc = verdict.error(f"{collective} on rank {self.rank}: ", collective)
        else:
            exc = cls(
                f"{collective} on rank {self.rank}: {err.message.decode(errors='replace')}{where}",
                peer,
                collective,
            )
        self._failure = exc
        self.close()
        raise exc

    # -- collectives --------------------------------------------------------------------

    def all_reduce(self, x: Any, algorithm: str = "auto", out: Any = None) -> Any:
        """Sum over all ranks; every rank gets identical bytes (see transport.schedule).

        The result goes to a new array, or into ``out`` (same shape and dtype; ``out=x``
        reduces in place and allocates nothing per call, which matters for large buffers).
        """
        deadline = self._begin("all_reduce")
        buf = as_host_buffer(x)
        src = buf.array.reshape(-1)
        if out is None:
            work = src.copy()
        else:
            obuf = as_host_buffer(out)
            if obuf.array.shape != buf.array.shape or obuf.code != buf.code:
                raise ValueError(
                    f"all_reduce out {obuf.array.shape} must match the input {buf.array.shape} and dtype"
                )
            work = obuf.array.reshape(-1)
            if not np.shares_memory(work, src):
                np.copyto(work, src)
        algo = schedule.allreduce_algorithm(self.world, src.nbytes, algorithm)
        if algo in ("exchange", "matching", "crossed"):
            for halves in schedule.matching_lanes(self.rank, self.world, work.size, algo):
                send = work
                if not self.fabric.adds_in_place:
                    # `work` is added into while its old value is sent: send a snapshot.
                    send = self._scratch(work.nbytes)[: work.nbytes].view(work.dtype)
                    np.copyto(send, work)
                lanes = [(peer, send[lo:hi], peer, work[lo:hi]) for peer, lo, hi in halves]
                self.transfer_lanes("all_reduce", deadline, lanes, ADD, buf.code)
        else:
            self._ring_all_reduce(deadline, work, buf.code)
        return out if out is not None else buf.wrap(work.reshape(buf.array.shape))

    def _ring_all_reduce(self, deadline: float, work: np.ndarray, code: int) -> None:
        """Both half-rings at once: each step is one engine call with a lane per direction."""
        rings = []
        for d, (base, end) in zip(schedule.RING_DIRECTIONS, schedule.ring_halves(work.size), strict=True):
            half = work[base:end]
            to, frm = (self.rank + d) % self.world, (self.rank - d) % self.world
            bounds = schedule.chunk_bounds(half.size, self.world)
            rings.append((to, frm, half, bounds, schedule.ring_steps(self.rank, self.world, d)))
        for i in range(2 * (self.world - 1)):
            lanes: list[Lane] = []
            for to, frm, half, bounds, steps in rings:
                (slo, shi), (rlo, rhi) = bounds[steps[i].send], bounds[steps[i].recv]
                lanes.append((to, half[slo:shi], frm, half[rlo:rhi]))
            op = ADD if steps[i].add else COPY  # both directions reduce-scatter, then all-gather, in step
            self.transfer_lanes("all_reduce", deadline, lanes, op, code)

    def _scratch(self, nbytes: int) -> np.ndarray:
        """A reused byte buffer of at least ``nbytes`` (fresh pages cost a fault each)."""
        if self._scratch_buf.nbytes < nbytes:
            self._scratch_buf = np.empty(nbytes, dtype=np.uint8)
        return self._scratch_buf

    def _gather_blocks(self, collective: str, buf: HostBuffer) -> np.ndarray:
        """[world, *shape]: block r is rank r's input."""
        deadline = self._begin(collective)
        out = np.empty((self.world, *buf.array.shape), dtype=buf.array.dtype)
        out[self.rank] = buf.array
        if self.world in (2, 4):
            for peer, sent, got in schedule.gather_rounds(self.rank, self.world):
                self.transfer(
                    collective, deadline, peer, out[sent.start : sent.stop], peer, out[got.start : got.stop]
                )
        else:
            for s in range(self.world - 1):
                send, recv = (self.rank - s) % self.world, (self.rank - s - 1) % self.world
                self.transfer(collective, deadline, self.spec.right, out[send], self.spec.left, out[recv])
        return out

    def all_gather(self, x: Any, dim: int = 0, collective: str = "all_gather") -> Any:
        """Concatenate every rank's ``x`` along ``dim`` in rank order."""
        buf = as_host_buffer(x)
        blocks = self._gather_blocks(collective, buf)
        return buf.wrap(np.concatenate(list(blocks), axis=dim))

    def dcp_query_all_gather(self, q: Any) -> Any:
        """DCP query all-gather: [tokens, heads, dim] -> [tokens, world * heads, dim], rank-major heads."""
        return self.all_gather(q, dim=1, collective="dcp_query_all_gather")

    def vocab_all_gather(self, logits: Any) -> Any:
        """Vocabulary all-gather: [tokens, vocab/world] shards -> [tokens, vocab], token-major rows."""
        return self.all_gather(logits, dim=-1, collective="vocab_all_gather")

    def lse_combine(self, out: Any, lse: Any) -> tuple[Any, Any]:
        """Combine partial attention outputs ``out`` [..., D] by their log-sum-exp ``lse`` [...].

        Every rank gathers all partials and combines them in rank order (lse_combine_local),
        so all ranks hold identical bytes. Returns (out in out's dtype, lse in fp32).
        """
        obuf, lbuf = as_host_buffer(out), as_host_buffer(lse)
        if lbuf.code != 0:
            raise TypeError("lse must be float32")
        outs = self._gather_blocks("lse_combine", obuf)
        lses = self._gather_blocks("lse_combine", lbuf)
        if obuf.code == 2:  # bf16 bits -> fp32
            outs = (outs.astype(np.uint32) << 16).view(np.float32)
        combined, new_lse = lse_combine_local(outs, lses)
        if obuf.code == 2:
            from transport.reference import f32_to_bf16

            return obuf.wrap(f32_to_bf16(combined)), lbuf.wrap(new_lse)
        return obuf.wrap(combined.astype(obuf.array.dtype)), lbuf.wrap(new_lse)


def lse_combine_local(outs: np.ndarray, lses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Online-softmax combine of N partials: ``outs`` [N, ..., D], ``lses`` [N, ...] -> fp32.

    out = sum_i w_i out_i / sum_i w_i with w_i = exp(lse_i - m), m = max_i lse_i, and
    lse = m + log sum_i w_i. A NaN or +inf LSE counts as -inf (an empty shard); where every
    shard is empty the output is 0 and the LSE -inf. Computed in float64 with
    transport.portable_math's exp and log and rounded to fp32 once, so every CPU (an x86
    host, a Spark's aarch64) gives the same bytes.
    """
    lse = np.asarray(lses, dtype=np.float64)
    lse = np.where(np.isnan(lse) | (lse == np.inf), -np.inf, lse)
    m = lse.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = exp_nonpositive(lse - m_safe)
    total = w.sum(axis=0)
    denom = np.where(total > 0, total, 1.0)
    weighted = np.where(w[..., None] > 0, w[..., None] * outs.astype(np.float64), 0.0)
    combined = weighted.sum(axis=0) / denom[..., None]
    new_lse = np.where(total > 0, m_safe + log_positive(denom), -np.inf)
    return combined.astype(np.float32), new_lse.astype(np.float32)
