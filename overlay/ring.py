"""Which vLLM groups ride the ring, and their transport communicators.

A group rides the ring when its name is a tensor- or decode-context-parallel group
(``tp:*``, ``dcp:*``) and its size equals the ring's world: its rank in the group is the
ring rank (one vLLM rank per node, as ``--nnodes N`` launches it). The ring itself comes
from the environment the launch renders:

* ``SPARKRING_RING_SPEC``: a JSON file ``{"rank", "world", "ports": [{cage, address,
  peer_rank, peer_address, twins: [{rdma_device, rdma_port, gid_index}, ...]}]}`` (the overlay
  role writes it from the inventory; on verbs the fabric stripes over each port's twins), or
* ``SPARKRING_RING_PREFIX``: the inventory's cable geometry on ``<prefix>.<cable>.0/24``
  (``198.19`` in the sim, ``127.77`` on loopback), rank taken from the group.

``SPARKRING_TRANSPORT_FABRIC`` (tcp|verbs, default tcp) and ``SPARKRING_TRANSPORT_PORT``
(default 18600) choose the fabric and the rendezvous port; ``SPARKRING_TRANSPORT_TIMEOUT_S``
and ``SPARKRING_TRANSPORT_SETUP_TIMEOUT_S`` bound a collective and the rendezvous;
``SPARKRING_TRANSPORT_CONNECTIONS`` (tcp, 1-4, default the fabric's) and
``SPARKRING_TRANSPORT_STRIPE_MIN_BYTES`` stripe large transfers over several connections per
link (transport.fabric_tcp). The communicator is created on
the group's first supported collective, which every rank of the group reaches together. From then on
overlay.fault's watch stops this process on the first dead-peer verdict of any of them
(``SPARKRING_HEARTBEAT_S`` and ``SPARKRING_DEAD_AFTER_S`` set the bound: transport.liveness).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from overlay.fault import Watch
from transport import Communicator
from transport._native import MAX_STRIPES
from transport.comm import DEFAULT_TCP_PORT
from transport.fabric_tcp import DEFAULT_STRIPE_MIN_BYTES
from transport.geometry import world_size_problem
from transport.topology import RingSpec, cable_geometry, from_hostvars

RING_GROUPS = ("tp:", "dcp:")
# Ranks reach a group's first collective minutes apart on a loaded node (model load, first
# forward); later collectives are lock-step, but a slow peer is not a dead one.
SETUP_TIMEOUT_S = 600.0
TIMEOUT_S = 120.0


def communicator_settings(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The Communicator's settings from the launch environment; a bad value is refused naming
    its variable, before any rank dials."""

    def number(name: str, default: float | None, kind: type) -> Any:
        text = environ.get(name, "")
        try:
            return kind(text) if text else default if default is None else kind(default)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"{name}={text!r} is not {what}") from None

    settings = {
        "fabric": environ.get("SPARKRING_TRANSPORT_FABRIC", "tcp"),
        "tcp_port": number("SPARKRING_TRANSPORT_PORT", DEFAULT_TCP_PORT, int),
        "timeout_s": number("SPARKRING_TRANSPORT_TIMEOUT_S", TIMEOUT_S, float),
        "setup_timeout_s": number("SPARKRING_TRANSPORT_SETUP_TIMEOUT_S", SETUP_TIMEOUT_S, float),
        "connections": number("SPARKRING_TRANSPORT_CONNECTIONS", None, int),  # None: the fabric's
        "stripe_min_bytes": number("SPARKRING_TRANSPORT_STRIPE_MIN_BYTES", DEFAULT_STRIPE_MIN_BYTES, int),
    }
    connections = settings["connections"]
    if connections is not None and not 1 <= connections <= MAX_STRIPES:
        raise ValueError(f"SPARKRING_TRANSPORT_CONNECTIONS={connections}: 1 to {MAX_STRIPES}")
    if connections is not None and connections > 1 and settings["fabric"] != "tcp":
        raise ValueError(
            "SPARKRING_TRANSPORT_CONNECTIONS applies to the tcp fabric; verbs stripes over each port's twins"
        )
    if settings["stripe_min_bytes"] < 1:
        raise ValueError(
            f"SPARKRING_TRANSPORT_STRIPE_MIN_BYTES={settings['stripe_min_bytes']}: must be positive"
        )
    return settings


def ring_spec(group_rank: int, group_world: int) -> RingSpec | None:
    """The ring this process is on, or None when the environment names no ring."""
    spec_file = os.environ.get("SPARKRING_RING_SPEC")
    if spec_file:
        doc = json.loads(Path(spec_file).read_text())
        # ring.json holds the inventory's sparkring_ports as they are: one reader for both.
        spec = from_hostvars(
            {
                "sparkring_rank": doc["rank"],
                "sparkring_world_size": doc["world"],
                "sparkring_ports": doc["ports"],
            }
        )
        if (spec.rank, spec.world) != (group_rank, group_world):
            raise ValueError(
                f"{spec_file} says ring rank {spec.rank} of {spec.world}, but vLLM put this process at "
                f"rank {group_rank} of {group_world}: --node-rank must equal the inventory's sparkring_rank"
            )
        return spec
    prefix = os.environ.get("SPARKRING_RING_PREFIX")
    if prefix:
        return cable_geometry(group_rank, group_world, prefix)
    return None


class RingGroups:
    """One transport communicator per vLLM group name, created on first use."""

    def __init__(self) -> None:
        self._comms: dict[str, Communicator] = {}
        self._gpus: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.watch = Watch(self.communicators, self._rank)
        self._ranks: dict[str, int] = {}

    def communicators(self) -> dict[str, Communicator]:
        with self._lock:
            return dict(self._comms)

    def _rank(self) -> int | None:
        with self._lock:
            return next(iter(self._ranks.values()), None)

    def rides_ring(self, unique_name: str, world: int) -> bool:
        return unique_name.startswith(RING_GROUPS) and world_size_problem(world) is None

    def get(self, unique_name: str, rank: int, world: int) -> Communicator | None:
        """The group's communicator (creating it joins the rendezvous), or None if no ring is set."""
        with self._lock:
            if unique_name not in self._comms:
                spec = ring_spec(rank, world)
                if spec is None:
                    return None
                settings = communicator_settings()
                settings["tcp_port"] += len(self._comms)  # one rendezvous port per group
                self._comms[unique_name] = Communicator(spec, **settings)
                if not self._ranks:
                    atexit.register(self.close)
                self._ranks[unique_name] = rank
                self.watch.start()
            return self._comms[unique_name]

    def gpu(self, unique_name: str, rank: int, world: int) -> Any | None:
        """The group's GPU collectives (transport.gpu, stream-ordered and capturable), created on
        the group's first CUDA collective; None if no ring is set, or if that first call comes
        while a CUDA graph is being captured (its pinned arena cannot be allocated then)."""
        import torch

        with self._lock:
            known = self._gpus.get(unique_name)
        if known is not None:
            return known
        if torch.cuda.is_current_stream_capturing():
            return None
        comm = self.get(unique_name, rank, world)
        if comm is None:
            return None
        from transport.gpu import GpuCollectives

        with self._lock:
            if unique_name not in self._gpus:
                self._gpus[unique_name] = GpuCollectives(
                    comm, arena_bytes=int(os.environ.get("SPARKRING_GPU_ARENA_BYTES", 64 << 20))
                )
            return self._gpus[unique_name]

    def close(self) -> None:
        """Close every communicator at a clean exit: its BYE tells the neighbours this is no fault."""
        for comm in self.communicators().values():
            try:
                comm.close()
            except Exception as exc:  # at exit: say it, never mask the exit itself
                print(f"sparkring overlay: closing the ring at exit: {exc}", file=sys.stderr)

    def stats(self) -> dict[str, Any]:
        """Per group: the engine's per-neighbour counters, and (GPU groups) the progress thread's
        commands per collective, which include every CUDA graph replay."""
        with self._lock:
            out: dict[str, Any] = {name: comm.stats() for name, comm in self._comms.items()}
            for name, gpu in self._gpus.items():
                out[f"{name}.progress"] = gpu.stats()
            return out


GROUPS = RingGroups()
