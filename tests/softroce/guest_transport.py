"""The transport's verbs fabric between the Soft-RoCE guests (run by guest-init.sh).

Runs inside a QEMU guest with one rxe device per twin of each of its ring ports, from the
staged repository, with the Debian python3/numpy of the guest (no torch there, so bf16 is left
to the tcp lanes). The guest's ring is its ring spec (--spec, written by ring_specs.py): a pair
on one cable or a ring of four, each port a cage of two twins (the first with the address, the
second RDMA over its link-local GID), so every step runs the fabric striped over both twins.
One step per call, every rank running the same step; the last line printed is the phase's
one-line detail and the exit status is the verdict:

    build      compile the native engines with the guest's gcc, check the verbs struct
               layouts against the guest's infiniband/verbs.h, open every twin's rxe device
               and resolve its "auto" GID (first twin: IPv4-mapped; second: link-local)
    verbs      rendezvous, RC QP bring-up on every twin, then RDMA WRITE with immediate both
               ways with each neighbour, every payload verified; the rxe counters of every
               twin show it carried its share (the striping)
    probe      ``python -m transport probe --fabric verbs --ring-spec``: ping-pong and
               bandwidth per link, an all-reduce burn, every payload verified
    burn       the qualify stage's burn gate (every collective at 16 KiB and 1 MiB, fp32 and
               fp16) on this ring, every result compared byte for byte
    allreduce  all-reduce (exchange or matching, and ring; fp32, fp16; 1 KiB to 4 MiB)
               against the numpy reference, byte for byte
    cmdring    the same all-reduces and an all-gather posted on the command ring and run by
               the native progress thread over the verbs fabric (the GPU's path, with a
               host thread as the producer), byte for byte

Each step writes its figures as JSON to $RESULTS/transport_<step>.json.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from transport import Communicator, RingSpec, reference, verbs
from transport._native import cache_root, engine
from transport.buffers import F16, F32
from transport.geometry import matching_peers
from transport.topology import from_hostvars

RESULTS = Path(os.environ.get("RESULTS", "/results"))
# Every step rendezvouses on its own port: a rank that finished a step early dials the next
# one while its peer may still hold the previous port (the dial retries, bounded).
TCP_PORTS = {"verbs": 18700, "probe": 18710, "allreduce": 18720, "cmdring": 18730, "burn": 18740}
COLLECTIVE_TIMEOUT_S = 60.0  # TCG guests move ~10 MB/s
SETUP_TIMEOUT_S = 150.0
# 1 MiB spans several 256 KiB slots of the window, 2 MiB more frames than one twin's window.
WRITE_SIZES = (64, 4096, 1 << 20, 2 << 20)
ALLREDUCE_SIZES = (1 << 10, 16 << 10, 1 << 20, 4 << 20)  # 4 MiB reuses every slot after its ack
ALLREDUCE_ITERS = 2
# The probe as cable qualification runs it, sized for a TCG guest.
PROBE_ARGS = (
    "--fabric verbs --pingpong-size 4096 --pingpong-iters 100 --bw-size 1048576 --bw-iters 4 "
    "--burn all_reduce --burn-dtype float32,float16 --burn-size 16384 --burn-iters 100"
)
# The qualify stage's burn gate (roles/qualify/defaults), sized for a TCG guest.
BURN_ARGS = (
    "--fabric verbs --skip-links --burn all_reduce,all_gather,dcp_query_all_gather,lse_combine,vocab_all_gather "
    "--burn-size 16384,1048576 --burn-iters 20,2 --burn-dtype float32,float16"
)


def _ring(args: argparse.Namespace) -> RingSpec:
    doc = json.loads(Path(args.spec).read_text())
    return from_hostvars(
        {"sparkring_rank": doc["rank"], "sparkring_world_size": doc["world"], "sparkring_ports": doc["ports"]}
    )


def _communicator(args: argparse.Namespace, step: str) -> Communicator:
    return Communicator(
        _ring(args),
        fabric="verbs",
        tcp_port=TCP_PORTS[step],
        timeout_s=COLLECTIVE_TIMEOUT_S,
        setup_timeout_s=SETUP_TIMEOUT_S,
    )


def _pattern(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _devices(spec: RingSpec) -> list[str]:
    return [twin.rdma_device for port in spec.ports for twin in port.twins]


def _rxe_packets(devices: list[str]) -> dict[str, dict[str, int]]:
    """Packets each twin's rxe device sent and received (its hw counters)."""
    out = {}
    for device in devices:
        base = Path(f"/sys/class/infiniband/{device}/ports/1/hw_counters")
        out[device] = {name: int((base / name).read_text()) for name in ("sent_pkts", "rcvd_pkts")}
    return out


def _link_facts(comm: Communicator) -> dict[str, Any]:
    """Each verbs link as brought up, per twin: device, QP numbers, source GID, path MTU."""
    return {
        str(peer): [
            {
                "twin": twin.twin,
                "device": twin.dev.name,
                "tx_qpn": twin.tx_qpn,
                "rx_qpn": twin.rx_qpn,
                "sgid_index": twin.sgid_index,
                "gid": str(ipaddress.IPv6Address(twin.gid)),
                "path_mtu": verbs.MTU_BYTES.get(twin.dev.mtu_enum),
            }
            for twin in link.twins
        ]
        for peer, link in comm.links.items()
    }


def _save(step: str, doc: dict[str, Any]) -> None:
    (RESULTS / f"transport_{step}.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(json.dumps(doc, sort_keys=True))


def step_build(args: argparse.Namespace) -> str:
    t0 = time.monotonic()
    engine()
    verbs.libs()  # compiles the verbs engine; refuses if the ctypes layouts differ from verbs.h
    sizes = {name: layout["size"] for name, layout in verbs.measured_layouts().items()}
    devices = verbs.list_devices()
    twins = {}
    for port in _ring(args).ports:
        for t, twin in enumerate(port.twins):
            dev = verbs.Device.open(twin.rdma_device, twin.rdma_port)
            try:
                if t == 0:
                    index, gid = dev.resolve_gid_index("auto", port.address)
                else:
                    index, gid = dev.resolve_link_local_gid_index("auto")
                twins[twin.rdma_device] = {
                    "cage": port.cage,
                    "twin": t,
                    "gid_index": index,
                    "gid": str(ipaddress.IPv6Address(gid)),
                    "active_mtu": verbs.MTU_BYTES.get(dev.mtu_enum),
                }
            finally:
                dev.close()
    built = sorted(
        p.name
        for p in cache_root().rglob("*")
        if p.is_file() and p.suffix in (".so", "") and p.name[0] != "."
    )
    _save(
        "build",
        {
            "seconds": round(time.monotonic() - t0, 2),
            "cache": str(cache_root()),
            "built": built,
            "layout_sizes": sizes,
            "devices": devices,
            "twins": twins,
        },
    )
    resolved = "; ".join(f"{name} GID {t['gid_index']} {t['gid']}" for name, t in twins.items())
    return (
        f"built {', '.join(built)} with the guest's gcc; layouts match verbs.h ({len(sizes)} structs); "
        f"devices {devices}; auto GIDs: {resolved}"
    )


def step_verbs(args: argparse.Namespace) -> str:
    spec = _ring(args)
    devices = _devices(spec)
    before = _rxe_packets(devices)
    t0 = time.monotonic()
    with _communicator(args, "verbs") as comm:
        setup_s = time.monotonic() - t0
        exchanged = []
        # Round by round (every rank pairs with the same neighbour at once), each size both ways.
        for peer in matching_peers(spec.rank, spec.world):
            for size in WRITE_SIZES:
                send, want, got = (
                    _pattern(size, 97 * size + spec.rank),
                    _pattern(size, 97 * size + peer),
                    np.zeros(size, np.uint8),
                )
                t1 = time.monotonic()
                comm.transfer(
                    "softroce_write_imm", time.monotonic() + COLLECTIVE_TIMEOUT_S, peer, send, peer, got
                )
                if not np.array_equal(got, want):
                    bad = int(np.count_nonzero(got != want))
                    raise SystemExit(
                        f"RDMA WRITE with immediate of {size} B from rank {peer}: {bad} bytes differ"
                    )
                exchanged.append(
                    {"peer": peer, "size_bytes": size, "seconds": round(time.monotonic() - t1, 4)}
                )
        doc = {
            "setup_seconds": round(setup_s, 2),
            "exchanged": exchanged,
            "links": _link_facts(comm),
            "stats": {str(k): v for k, v in comm.stats().items()},
        }
    after = _rxe_packets(devices)
    doc["rxe_packets"] = {
        device: {name: after[device][name] - before[device][name] for name in after[device]}
        for device in devices
    }
    _save("verbs", doc)
    idle = [
        device
        for device, moved in doc["rxe_packets"].items()
        if not (moved["sent_pkts"] and moved["rcvd_pkts"])
    ]
    if idle:
        raise SystemExit(f"twins that carried no traffic (the fabric must stripe over every twin): {idle}")
    packets = ", ".join(
        f"{device} {moved['sent_pkts']}/{moved['rcvd_pkts']}" for device, moved in doc["rxe_packets"].items()
    )
    return (
        f"rendezvous + RC QPs on {len(devices)} twins (path MTU "
        f"{sorted({t['path_mtu'] for link in doc['links'].values() for t in link})}) up in {setup_s:.1f} s; "
        f"WRITE-with-imm {'/'.join(map(str, WRITE_SIZES))} B both ways with ranks "
        f"{matching_peers(spec.rank, spec.world)} verified; packets sent/received per twin: {packets}"
    )


def _run_probe(args: argparse.Namespace, step: str, extra: str) -> dict[str, Any]:
    out = RESULTS / f"{step}.json"
    cmd = [sys.executable, "-m", "transport", "probe", *extra.split(), "--ring-spec", args.spec]
    cmd += f"--tcp-port {TCP_PORTS[step]} --timeout {COLLECTIVE_TIMEOUT_S} --output {out}".split()
    cmd += ["--setup-timeout", str(SETUP_TIMEOUT_S)]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, check=False).returncode
    doc = json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": "no JSON written"}
    if rc != 0 or not doc["ok"]:
        raise SystemExit(f"probe exit {rc}: {doc.get('error')}")
    return doc


def step_probe(args: argparse.Namespace) -> str:
    doc = _run_probe(args, "probe", PROBE_ARGS)
    links = "; ".join(
        f"rank {link['peer_rank']}: rtt p50 {link['pingpong']['rtt_us']['p50']} us, bw tx "
        f"{link['bandwidth']['tx']['gbit_s']} rx {link['bandwidth']['rx']['gbit_s']} Gbit/s"
        for link in doc["links"]
    )
    burns = ", ".join(f"{b['dtype']} {b['iterations']}x {b['mismatches']} mismatches" for b in doc["burns"])
    return f"probe ok: {links}; all_reduce 16 KiB {burns}"


def step_burn(args: argparse.Namespace) -> str:
    doc = _run_probe(args, "burn", BURN_ARGS)
    calls = sum(b["iterations"] for b in doc["burns"])
    kinds = sorted({b["collective"] for b in doc["burns"]})
    return (
        f"burn gate ok on {doc['world']} ranks: {len(doc['burns'])} burns ({', '.join(kinds)}; 16 KiB and 1 MiB; "
        f"float32, float16), {calls} calls, 0 mismatches"
    )


def _algorithms(world: int) -> tuple[str, str]:
    return ("exchange" if world == 2 else "matching", "ring")


def step_allreduce(args: argparse.Namespace) -> str:
    runs, mismatches = [], 0
    with _communicator(args, "allreduce") as comm:
        for algorithm, (np_type, code), size in itertools.product(
            _algorithms(comm.world), ((np.float32, F32), (np.float16, F16)), ALLREDUCE_SIZES
        ):
            n = size // np.dtype(np_type).itemsize
            bad, t0 = 0, time.monotonic()
            for it in range(ALLREDUCE_ITERS):
                inputs = [
                    np.random.default_rng(size * 31 + it * 2 + r).standard_normal(n).astype(np_type)
                    for r in range(comm.world)
                ]
                want = reference.all_reduce(inputs, code, algorithm).view(np.uint8)
                got = comm.all_reduce(inputs[comm.rank], algorithm)
                bad += int(not np.array_equal(got.view(np.uint8), want))
            mismatches += bad
            print(f"{algorithm} {np.dtype(np_type).name} {size} B: {bad} mismatches", flush=True)
            runs.append(
                {
                    "algorithm": algorithm,
                    "dtype": np.dtype(np_type).name,
                    "size_bytes": size,
                    "iterations": ALLREDUCE_ITERS,
                    "mismatches": bad,
                    "seconds": round(time.monotonic() - t0, 3),
                }
            )
    _save("allreduce", {"runs": runs, "mismatches": mismatches})
    if mismatches:
        raise SystemExit(
            f"all-reduce: {mismatches} of {len(runs) * ALLREDUCE_ITERS} results differ from the reference"
        )
    return (
        f"{len(runs) * ALLREDUCE_ITERS} all-reduces ({', '.join(_algorithms(comm.world))}; float32, float16; "
        "1 KiB..4 MiB) byte-identical to the reference, 0 mismatches"
    )


def step_cmdring(args: argparse.Namespace) -> str:
    from transport.command_ring import CommandRing, host_memory

    runs, mismatches = [], 0
    with _communicator(args, "cmdring") as comm:
        ring = CommandRing(comm, host_memory(2 * max(ALLREDUCE_SIZES) + 4096), spin_us=50)
        for algorithm, (np_type, code), size in itertools.product(
            _algorithms(comm.world), ((np.float32, F32), (np.float16, F16)), ALLREDUCE_SIZES
        ):
            n = size // np.dtype(np_type).itemsize
            inputs = [
                np.random.default_rng(size * 37 + r).standard_normal(n).astype(np_type)
                for r in range(comm.world)
            ]
            want = reference.all_reduce(inputs, code, algorithm).view(np.uint8)
            bad = int(not np.array_equal(ring.all_reduce(inputs[comm.rank], algorithm).view(np.uint8), want))
            mismatches += bad
            runs.append(
                {
                    "collective": "all_reduce",
                    "algorithm": algorithm,
                    "dtype": np.dtype(np_type).name,
                    "size_bytes": size,
                    "mismatches": bad,
                }
            )
        blocks = [_pattern(4096, r).view(np.float32) for r in range(comm.world)]
        got = ring.all_gather(blocks[comm.rank]).view(np.uint8)  # random bytes: compare bits (NaN too)
        bad = int(not np.array_equal(got, np.concatenate(blocks).view(np.uint8)))
        mismatches += bad
        runs.append({"collective": "all_gather", "size_bytes": 4096, "mismatches": bad})
        stats = ring.stats()
        ring.close()
    _save("cmdring", {"runs": runs, "mismatches": mismatches, "progress_stats": stats})
    if mismatches or stats["errors"] or stats["refused"]:
        raise SystemExit(f"command ring over verbs: {mismatches} mismatches, progress thread {stats}")
    return f"{len(runs)} collectives through the progress thread over verbs byte-identical, 0 mismatches"


STEPS = {
    "build": step_build,
    "verbs": step_verbs,
    "probe": step_probe,
    "burn": step_burn,
    "allreduce": step_allreduce,
    "cmdring": step_cmdring,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--spec", required=True, help="this guest's ring spec (ring_specs.py wrote it)")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(STEPS[args.step](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
