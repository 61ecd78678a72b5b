"""``python -m transport probe``: qualify this rank's ring links and burn collectives.

Every rank of the ring runs the same command (with its own --rank). The probe measures,
per link, ping-pong latency initiated from each end and bulk bandwidth in each direction,
verifying every payload, then runs collective burns whose every result is compared byte
for byte with the numpy reference. It prints one JSON document (schema below) and exits 0
only if every check passed.

JSON (``schema: sparkring.transport.probe/1``; keys are stable, new keys may be added):

    {schema, ok, error, rank, world, fabric, hostname, started_utc, seconds,
     settings: {timeout_s, slot_bytes, window, tcp_port},
     links: [{peer_rank, cage, address, peer_address,
              pingpong: {size_bytes, iterations, mismatches,
                         rtt_us: {p50, p99}, one_way_us: {p50, p99}},
              bandwidth: {size_bytes, iterations,
                          tx: {gbit_s, seconds, mismatches},    # this rank sends
                          rx: {gbit_s, seconds, mismatches}}}], # peer sends, timed here
     burns: [{collective, dtype, size_bytes, iterations, mismatches, p50_us, p99_us}],
     stats: {"<peer rank>": {frames_tx, frames_rx, bytes_tx, bytes_rx, acks_tx, acks_rx, stripe_bytes_tx}}}

``pingpong`` is measured with this rank as the initiator (the peer's document holds the
other direction). ``one_way_us`` is half the round trip. A failure sets ``ok`` false and
``error`` to the message, which names the peer and the collective.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from transport import reference, schedule
from transport.buffers import BF16, F16, F32, bf16_from_bits, result_bytes
from transport.comm import DEFAULT_TCP_PORT, Communicator, lse_combine_local
from transport.errors import TransportError
from transport.topology import Port, RingSpec, cable_geometry, from_hostvars

SCHEMA = "sparkring.transport.probe/1"
DTYPES = {"float32": (np.float32, F32), "float16": (np.float16, F16), "bfloat16": (np.uint16, BF16)}
COLLECTIVES = ("all_reduce", "all_gather", "dcp_query_all_gather", "vocab_all_gather", "lse_combine")
VARIANTS = 8  # distinct input sets a burn cycles through (references precomputed)


def _percentiles(ns: np.ndarray, scale: float = 1e-3) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(ns, 50)) * scale, 3),
        "p99": round(float(np.percentile(ns, 99)) * scale, 3),
    }


def _pattern(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def pingpong(comm: Communicator, peer: int, initiator: bool, size: int, iters: int) -> dict[str, Any] | None:
    """Initiator sends, the peer echoes; returns the initiator's figures."""
    send = _pattern(size, comm.rank * 7919 + peer)
    recv = np.empty_like(send)
    rtts, mismatches = np.empty(iters, dtype=np.int64), 0
    for i in range(iters):
        if initiator:
            send[:8] = np.frombuffer(np.int64(i).tobytes(), dtype=np.uint8)
            t0 = time.perf_counter_ns()
            comm.transfer("pingpong", time.monotonic() + comm.timeout_s, peer, send, None, None)
            comm.transfer("pingpong", time.monotonic() + comm.timeout_s, None, None, peer, recv)
            rtts[i] = time.perf_counter_ns() - t0
            mismatches += int(not np.array_equal(send, recv))
        else:
            comm.transfer("pingpong", time.monotonic() + comm.timeout_s, None, None, peer, recv)
            comm.transfer("pingpong", time.monotonic() + comm.timeout_s, peer, recv, None, None)
    if not initiator:
        return None
    return {
        "size_bytes": size,
        "iterations": iters,
        "mismatches": mismatches,
        "rtt_us": _percentiles(rtts),
        "one_way_us": _percentiles(rtts / 2),
    }


def bandwidth(comm: Communicator, peer: int, sender: bool, size: int, iters: int) -> dict[str, Any]:
    """One direction of bulk transfer; the receiver acknowledges each message with 8 bytes."""
    seed = (comm.rank if sender else peer) * 104729 + 1
    expect = _pattern(size, seed)
    buf = expect if sender else np.empty_like(expect)
    token = np.zeros(8, dtype=np.uint8)
    mismatches = 0
    t0 = time.perf_counter()
    for _ in range(iters):
        deadline = time.monotonic() + comm.timeout_s
        if sender:
            comm.transfer("bandwidth", deadline, peer, buf, None, None)
            comm.transfer("bandwidth", deadline, None, None, peer, token)
        else:
            comm.transfer("bandwidth", deadline, None, None, peer, buf)
            mismatches += int(not np.array_equal(buf, expect))
            comm.transfer("bandwidth", deadline, peer, token, None, None)
    seconds = time.perf_counter() - t0
    return {
        "gbit_s": round(size * iters * 8 / seconds / 1e9, 4),
        "seconds": round(seconds, 6),
        "mismatches": mismatches,
    }


def qualify_links(
    comm: Communicator, size: int, iters: int, bw_size: int, bw_iters: int
) -> list[dict[str, Any]]:
    """Per link, in matching rounds (every rank busy on one link at a time)."""
    out = []
    for peer in schedule.matching_peers(comm.rank, comm.world):
        port = comm.spec.port_to(peer)
        first = comm.rank < peer
        mine = None
        for initiator in (first, not first):
            got = pingpong(comm, peer, initiator, size, iters)
            mine = got or mine
        directions = {}
        for sender in (first, not first):
            directions["tx" if sender else "rx"] = bandwidth(comm, peer, sender, bw_size, bw_iters)
        out.append(
            {
                "peer_rank": peer,
                "cage": port.cage,
                "address": port.address,
                "peer_address": port.peer_address,
                "pingpong": mine,
                "bandwidth": {"size_bytes": bw_size, "iterations": bw_iters, **directions},
            }
        )
    return out


def _inputs(collective: str, dtype: str, size: int, world: int, variant: int) -> list[np.ndarray]:
    """Every rank's input for one burn variant (all ranks can compute all of them)."""
    np_type, code = DTYPES[dtype]
    n = max(1, size // np.dtype(np_type).itemsize)
    out = []
    for r in range(world):
        rng = np.random.default_rng(1_000_003 * variant + r)
        x = rng.standard_normal(n).astype(np.float32)
        out.append(reference.f32_to_bf16(x) if code == BF16 else x.astype(np_type))
    if collective in ("dcp_query_all_gather", "lse_combine"):
        out = [x[: n - n % 8].reshape(-1, 2, 4) for x in out]  # [tokens, heads, dim]
    elif collective == "vocab_all_gather":
        out = [x[: n - n % 4].reshape(4, -1) for x in out]  # [tokens, vocab shard]
    return out


def _as_input(x: np.ndarray, dtype: str) -> Any:
    return bf16_from_bits(x) if dtype == "bfloat16" else x


def _expected(collective: str, inputs: list[np.ndarray], code: int, lses: list[np.ndarray]) -> np.ndarray:
    if collective == "all_reduce":
        return reference.all_reduce(inputs, code)
    if collective == "all_gather":
        return np.concatenate(inputs, axis=0)
    if collective == "dcp_query_all_gather":
        return np.concatenate(inputs, axis=1)
    if collective == "vocab_all_gather":
        return np.concatenate(inputs, axis=-1)
    outs = np.stack(inputs)
    if code == BF16:
        outs = reference.bf16_to_f32(outs)
    combined, _ = lse_combine_local(outs, np.stack(lses))
    return reference.f32_to_bf16(combined) if code == BF16 else combined.astype(inputs[0].dtype)


def burn(
    comm: Communicator, collective: str, dtype: str, size: int, iters: int, flip: bool = False
) -> dict[str, Any]:
    """``iters`` calls of one collective, each result compared byte for byte.

    ``flip`` is the gate's test hook: one byte of the first result is flipped before the
    comparison, as a corrupted transfer would leave it.
    """
    code = DTYPES[dtype][1]
    cases = []
    for v in range(min(VARIANTS, iters)):
        inputs = _inputs(collective, dtype, size, comm.world, v)
        lses = [
            np.random.default_rng(v * 31 + r).standard_normal(x.shape[:-1]).astype(np.float32) * 4
            for r, x in enumerate(inputs)
        ]
        want = _expected(collective, inputs, code, lses).view(np.uint8).reshape(-1)
        cases.append((_as_input(inputs[comm.rank], dtype), lses[comm.rank], want))
    call = getattr(comm, collective)
    times, mismatches = np.empty(iters, dtype=np.int64), 0
    for i in range(iters):
        x, lse, want = cases[i % len(cases)]
        t0 = time.perf_counter_ns()
        got = call(x, lse)[0] if collective == "lse_combine" else call(x)
        times[i] = time.perf_counter_ns() - t0
        result = result_bytes(got)
        if flip and i == 0:
            result = result.copy()
            result[result.size // 2] ^= 0x01
        mismatches += int(not np.array_equal(result, want))
    return {
        "collective": collective,
        "dtype": dtype,
        "size_bytes": size,
        "iterations": iters,
        "mismatches": mismatches,
        **{k + "_us": v for k, v in _percentiles(times).items()},
    }


def burn_sizes(sizes: str, iters: str) -> list[tuple[int, int]]:
    """(payload bytes, calls) per burn size: ``--burn-iters`` is one count or one per size."""
    try:
        size_list = [int(size) for size in sizes.split(",")]
        iter_list = [int(n) for n in iters.split(",")]
    except ValueError:
        raise SystemExit(
            f"--burn-size {sizes!r} / --burn-iters {iters!r}: expected comma lists of integers"
        ) from None
    if len(iter_list) == 1:
        iter_list *= len(size_list)
    if len(iter_list) != len(size_list) or min(size_list + iter_list) < 1:
        raise SystemExit(f"--burn-iters {iters!r}: one count >= 1, or one per --burn-size ({sizes})")
    return list(zip(size_list, iter_list, strict=True))


def parse_port(text: str) -> Port:
    """``CAGE,ADDRESS,PEER_RANK,PEER_ADDRESS`` (tcp: no RDMA devices; verbs takes --ring-spec)."""
    try:
        cage, address, peer_rank, peer_address = text.split(",")
        return Port(int(cage), address, int(peer_rank), peer_address)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--port {text!r}: expected CAGE,ADDRESS,PEER_RANK,PEER_ADDRESS"
        ) from exc


def read_ring_spec(source: str) -> RingSpec:
    """A ring spec file (``-``: stdin): ``{rank, world, ports}`` with the inventory's port records.

    It is the overlay role's ring.json, or what a caller builds from the inventory's hostvars:
    each port names its twins' RDMA devices (``twins: [{rdma_device, rdma_port, gid_index}]``).
    """
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        return from_hostvars(
            {
                "sparkring_rank": doc["rank"],
                "sparkring_world_size": doc["world"],
                "sparkring_ports": doc["ports"],
            }
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--ring-spec {source}: not a ring spec ({{rank, world, ports}}): {exc}") from None


def ring_spec(args: argparse.Namespace) -> RingSpec:
    """The rank's ports from --ring-spec (devices per port), --ring-prefix, --address or --port."""
    if args.ring_spec:
        spec = read_ring_spec(args.ring_spec)
        for name in ("rank", "world"):
            given = getattr(args, name)
            if given is not None and given != getattr(spec, name):
                raise SystemExit(f"--{name} {given} contradicts --ring-spec ({name} {getattr(spec, name)})")
        return spec
    if args.rank is None or args.world is None:
        raise SystemExit("give --rank and --world (or a --ring-spec that holds them)")
    if args.ring_prefix:
        return cable_geometry(args.rank, args.world, args.ring_prefix)
    if args.address:
        if args.world != 2 or not args.peer_address:
            raise SystemExit("--address/--peer-address describe a pair: use --world 2 (or --port per cable)")
        return RingSpec(args.rank, 2, (Port(0, args.address, args.rank ^ 1, args.peer_address),))
    if args.port:
        return RingSpec(args.rank, args.world, tuple(args.port))
    raise SystemExit(
        "give the ports: --ring-spec, --ring-prefix, --address with --peer-address, or --port ..."
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fabric", choices=("tcp", "verbs"), default="tcp")
    p.add_argument("--rank", type=int, help="this rank (given by --ring-spec otherwise)")
    p.add_argument("--world", type=int, help="the ring's size (given by --ring-spec otherwise)")
    p.add_argument(
        "--ring-spec",
        help="JSON file ({rank, world, ports}, the overlay's ring.json; - reads stdin): the ports and, "
        "for verbs, each port's twin RDMA devices",
    )
    p.add_argument(
        "--ring-prefix", help="inventory cable geometry in PREFIX.i.0/24 (e.g. 198.19 on the sim ring)"
    )
    p.add_argument("--address", help="this rank's address on the cable (pairs)")
    p.add_argument("--peer-address", help="the peer's address on the cable (pairs)")
    p.add_argument(
        "--port", type=parse_port, action="append", help="CAGE,ADDRESS,PEER_RANK,PEER_ADDRESS (repeat)"
    )
    p.add_argument("--tcp-port", type=int, default=DEFAULT_TCP_PORT, help="rendezvous (and tcp data) port")
    p.add_argument("--timeout", type=float, default=30.0, help="bound on every collective, seconds")
    p.add_argument("--setup-timeout", type=float, default=60.0, help="bound on rendezvous, seconds")
    p.add_argument("--slot-bytes", type=int, default=256 * 1024)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--pingpong-size", type=int, default=16384)
    p.add_argument("--pingpong-iters", type=int, default=1000)
    p.add_argument("--bw-size", type=int, default=16 << 20)
    p.add_argument("--bw-iters", type=int, default=4)
    p.add_argument("--skip-links", action="store_true", help="only the burns")
    p.add_argument("--burn", default="all_reduce", help=f"comma list of {','.join(COLLECTIVES)}, or none")
    p.add_argument("--burn-dtype", default="float32", help="comma list of float32,float16,bfloat16")
    p.add_argument("--burn-size", default="16384", help="comma list of payload bytes per rank")
    p.add_argument(
        "--burn-iters",
        default="1000",
        help="calls per burn: one number, or a comma list matching --burn-size",
    )
    p.add_argument(
        "--test-flip-result",
        action="store_true",
        help="test hook: flip one byte of each burn's first result before comparing (the gate must fail)",
    )
    p.add_argument("--output", help="write the JSON here too (it always goes to stdout)")


def run(args: argparse.Namespace) -> int:
    """Run the probe; print the JSON; 0 only if everything passed."""
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "ok": False,
        "error": None,
        "rank": args.rank,
        "world": args.world,
        "fabric": args.fabric,
        "hostname": socket.gethostname(),
        "started_utc": started.isoformat(timespec="seconds"),
        "seconds": None,
        "settings": {
            "timeout_s": args.timeout,
            "slot_bytes": args.slot_bytes,
            "window": args.window,
            "tcp_port": args.tcp_port,
        },
        "links": [],
        "burns": [],
        "stats": {},
    }
    try:
        spec = ring_spec(args)
        doc["rank"], doc["world"] = spec.rank, spec.world
        with Communicator(
            spec,
            fabric=args.fabric,
            tcp_port=args.tcp_port,
            timeout_s=args.timeout,
            setup_timeout_s=args.setup_timeout,
            slot_bytes=args.slot_bytes,
            window=args.window,
        ) as comm:
            if not args.skip_links:
                doc["links"] = qualify_links(
                    comm, args.pingpong_size, args.pingpong_iters, args.bw_size, args.bw_iters
                )
            for collective in [c for c in args.burn.split(",") if c and c != "none"]:
                if collective not in COLLECTIVES:
                    raise SystemExit(f"--burn {collective!r}: choose from {', '.join(COLLECTIVES)}")
                for size, iters in burn_sizes(args.burn_size, args.burn_iters):
                    for dtype in args.burn_dtype.split(","):
                        doc["burns"].append(
                            burn(comm, collective, dtype, size, iters, flip=args.test_flip_result)
                        )
            doc["stats"] = {str(k): v for k, v in comm.stats().items()}
        bad = [link for link in doc["links"] if _link_mismatches(link)] + [
            b for b in doc["burns"] if b["mismatches"]
        ]
        doc["ok"] = not bad
        if bad:
            doc["error"] = f"{len(bad)} check(s) saw mismatched payloads"
    except (TransportError, OSError, ValueError) as exc:
        doc["error"] = str(exc)
    doc["seconds"] = round(time.monotonic() - t0, 3)
    text = json.dumps(doc, indent=2, sort_keys=True)
    print(text)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    if doc["error"]:
        print(f"probe failed on rank {doc['rank']}: {doc['error']}", file=sys.stderr)
    return 0 if doc["ok"] else 1


def _link_mismatches(link: dict[str, Any]) -> int:
    pp = link["pingpong"]["mismatches"] if link["pingpong"] else 0
    return pp + link["bandwidth"]["tx"]["mismatches"] + link["bandwidth"]["rx"]["mismatches"]
