"""A link over several TCP connections (transport.fabric_tcp's stripes): the bytes of one
connection, and the parts on every connection. Ends whose counts differ: test_transport_loopback."""

from __future__ import annotations

import numpy as np
import pytest
from test_transport_loopback import _bits, _input
from transport_ranks import run_ring

from transport import reference
from transport.buffers import F16, F32
from transport.comm import Communicator

STRIPE_MIN = 64 * 1024
SIZES = [1000, 16_384, 100_003, 600_001]  # elements: below the stripe threshold, at it, odd, many frames


def striped_rank(spec, tcp_port: int, connections: int | None, algorithms: tuple[str, ...]) -> dict:
    out: dict = {}
    with Communicator(
        spec,
        tcp_port=tcp_port,
        timeout_s=60,
        slot_bytes=64 * 1024,
        connections=connections,
        stripe_min_bytes=STRIPE_MIN,
    ) as comm:
        for dtype in ("float32", "float16"):
            for n in SIZES:
                before = {peer: s["stripe_bytes_tx"] for peer, s in comm.stats().items()}
                for algo in algorithms:
                    out[(dtype, n, algo)] = _bits(comm.all_reduce(_input(spec.rank, n, dtype), algo))
                after = comm.stats()
                out[("striped", dtype, n)] = sum(after[p]["stripe_bytes_tx"] - before[p] for p in after)
        gathered = comm.all_gather(_input(spec.rank, 300_000, "float32"))
        out["gather"] = _bits(gathered)
        out["stats"] = comm.stats()
    return out


@pytest.mark.parametrize(
    ("world", "connections", "algorithms", "port"),
    # None: the tcp fabric's default, which stripes
    [
        (2, 4, ("auto", "ring"), 28710),
        (4, 2, ("auto", "crossed", "ring"), 28720),
        (2, None, ("auto",), 28730),
    ],
)
def test_a_striped_link_gives_the_bytes_of_one_connection_and_uses_them_all(
    world: int, connections: int | None, algorithms: tuple[str, ...], port: int
) -> None:
    results = run_ring(striped_rank, world, port, connections=connections, algorithms=algorithms)
    assert all(status == "ok" for status, _ in results), [v for s, v in results if s != "ok"]
    per_rank = [value for _, value in results]
    for dtype, code in (("float32", F32), ("float16", F16)):
        itemsize = np.dtype(dtype).itemsize
        for n in SIZES:
            inputs = [_input(r, n, dtype) for r in range(world)]
            for algo in algorithms:
                want = reference.all_reduce(inputs, code, algo).view(np.uint8)
                for r in range(world):
                    assert np.array_equal(per_rank[r][(dtype, n, algo)], want), (dtype, n, algo, r)
            # The ring's largest transfer is a half of a 1/world chunk: striped only from the threshold.
            striped = [per_rank[r][("striped", dtype, n)] for r in range(world)]
            if n * itemsize < STRIPE_MIN:
                assert striped == [0] * world, (dtype, n)
            if n * itemsize // (2 * world) >= STRIPE_MIN:
                assert all(s > 0 for s in striped), (dtype, n, striped)
    want = np.concatenate([_input(r, 300_000, "float32") for r in range(world)]).view(np.uint8)
    for r in range(world):
        assert np.array_equal(per_rank[r]["gather"], want)
        for stats in per_rank[r]["stats"].values():
            assert 0 < stats["stripe_bytes_tx"] < stats["bytes_tx"]


def test_a_connection_count_outside_the_engine_is_refused_before_any_socket() -> None:
    from transport.topology import cable_geometry

    with pytest.raises(ValueError, match="connections 5: a tcp link has 1 to 4"):
        Communicator(cable_geometry(0, 2, "127.77"), tcp_port=28750, connections=5)
