"""The transport's verbs fabric between the two Soft-RoCE guests (run by guest-init.sh).

Runs inside a QEMU guest with an rxe device, from the staged repository, with the Debian
python3/numpy of the guest (no torch there, so bf16 is left to the tcp lanes). One step per
call, both ranks running the same step; the last line printed is the phase's one-line detail
and the exit status is the verdict:

    build      compile the native engines with the guest's gcc, check the verbs struct
               layouts against the guest's infiniband/verbs.h, open the rxe device and
               resolve the "auto" GID index (the IPv4-mapped RoCE v2 GID)
    verbs      rendezvous, RC QP bring-up, then RDMA WRITE with immediate both ways,
               every payload verified
    probe      ``python -m transport probe --fabric verbs``: ping-pong, bandwidth, an
               all-reduce burn, every payload verified
    allreduce  2-rank all-reduce (exchange and ring schedules; fp32, fp16; 1 KiB to
               4 MiB) against the numpy reference, byte for byte
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

from transport import Communicator, Port, RingSpec, reference, verbs
from transport._native import cache_root, engine
from transport.buffers import F16, F32

RESULTS = Path(os.environ.get("RESULTS", "/results"))
# Every step rendezvouses on its own port: a rank that finished a step early dials the next
# one while its peer may still hold the previous port (the dial retries, bounded).
TCP_PORTS = {"verbs": 18700, "probe": 18710, "allreduce": 18720, "cmdring": 18730}
COLLECTIVE_TIMEOUT_S = 60.0  # TCG guests move ~10 MB/s
SETUP_TIMEOUT_S = 150.0
WRITE_SIZES = (64, 4096, 1 << 20)  # 1 MiB spans several 256 KiB slots of the window
ALLREDUCE_SIZES = (1 << 10, 16 << 10, 1 << 20, 4 << 20)  # 4 MiB reuses every slot after its ack
ALLREDUCE_ITERS = 2
# The probe as cable qualification runs it, sized for a TCG guest.
PROBE_ARGS = (
    "--fabric verbs --world 2 --pingpong-size 4096 --pingpong-iters 200 --bw-size 1048576 --bw-iters 4 "
    "--burn all_reduce --burn-dtype float32,float16 --burn-size 16384 --burn-iters 200"
)


def _spec(args: argparse.Namespace) -> RingSpec:
    """The pair on one cable: port cage 0, the rxe device, the IPv4-mapped GID found by 'auto'."""
    port = Port(0, args.addr, args.rank ^ 1, args.peer, args.device, 1, "auto")
    return RingSpec(args.rank, 2, (port,))


def _communicator(args: argparse.Namespace, step: str) -> Communicator:
    return Communicator(
        _spec(args),
        fabric="verbs",
        tcp_port=TCP_PORTS[step],
        timeout_s=COLLECTIVE_TIMEOUT_S,
        setup_timeout_s=SETUP_TIMEOUT_S,
    )


def _pattern(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _link_facts(comm: Communicator) -> dict[str, Any]:
    """Each verbs link as brought up: device, QP numbers, source GID, path MTU."""
    return {
        str(peer): {
            "device": link.dev.name,
            "tx_qpn": link.tx_qpn,
            "rx_qpn": link.rx_qpn,
            "sgid_index": link.sgid_index,
            "gid": str(ipaddress.IPv6Address(link.gid)),
            "path_mtu": verbs.MTU_BYTES.get(link.dev.mtu_enum),
        }
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
    dev = verbs.Device.open(args.device, 1)
    try:
        gid_index, gid = dev.resolve_gid_index("auto", args.addr)
        mtu = verbs.MTU_BYTES.get(dev.mtu_enum)
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
            "gid_index": gid_index,
            "gid": str(ipaddress.IPv6Address(gid)),
            "active_mtu": mtu,
        },
    )
    return (
        f"built {', '.join(built)} with the guest's gcc; layouts match verbs.h ({len(sizes)} structs); "
        f"devices {devices}; {args.device} auto GID index {gid_index} ({ipaddress.IPv6Address(gid)}), MTU {mtu}"
    )


def step_verbs(args: argparse.Namespace) -> str:
    peer = args.rank ^ 1
    t0 = time.monotonic()
    with _communicator(args, "verbs") as comm:
        setup_s = time.monotonic() - t0
        exchanged = []
        for size in WRITE_SIZES:
            send, want, got = (
                _pattern(size, 2 * size + args.rank),
                _pattern(size, 2 * size + peer),
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
            exchanged.append({"size_bytes": size, "seconds": round(time.monotonic() - t1, 4)})
        doc = {
            "setup_seconds": round(setup_s, 2),
            "exchanged": exchanged,
            "links": _link_facts(comm),
            "stats": {str(k): v for k, v in comm.stats().items()},
        }
    _save("verbs", doc)
    frames = doc["stats"][str(peer)]
    link = doc["links"][str(peer)]
    return (
        f"rendezvous + RC QPs (tx qpn {link['tx_qpn']}, rx qpn {link['rx_qpn']}, path MTU {link['path_mtu']}) "
        f"up in {setup_s:.1f} s; WRITE-with-imm {'/'.join(map(str, WRITE_SIZES))} B both ways verified; "
        f"frames tx {frames['frames_tx']} rx {frames['frames_rx']}"
    )


def step_probe(args: argparse.Namespace) -> str:
    out = RESULTS / "probe.json"
    cmd = [sys.executable, "-m", "transport", "probe", *PROBE_ARGS.split()]
    cmd += (
        f"--rank {args.rank} --address {args.addr} --peer-address {args.peer} --device {args.device}".split()
    )
    cmd += f"--tcp-port {TCP_PORTS['probe']} --timeout {COLLECTIVE_TIMEOUT_S} --output {out}".split()
    cmd += ["--setup-timeout", str(SETUP_TIMEOUT_S)]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, check=False).returncode
    doc = json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": "no JSON written"}
    if rc != 0 or not doc["ok"]:
        raise SystemExit(f"probe exit {rc}: {doc.get('error')}")
    link = doc["links"][0]
    burns = ", ".join(f"{b['dtype']} {b['iterations']}x {b['mismatches']} mismatches" for b in doc["burns"])
    return (
        f"probe ok: rtt p50 {link['pingpong']['rtt_us']['p50']} us, bw tx {link['bandwidth']['tx']['gbit_s']} "
        f"rx {link['bandwidth']['rx']['gbit_s']} Gbit/s, all_reduce 16 KiB {burns}"
    )


def step_allreduce(args: argparse.Namespace) -> str:
    runs, mismatches = [], 0
    with _communicator(args, "allreduce") as comm:
        for algorithm, (np_type, code), size in itertools.product(
            ("exchange", "ring"), ((np.float32, F32), (np.float16, F16)), ALLREDUCE_SIZES
        ):
            n = size // np.dtype(np_type).itemsize
            bad, t0 = 0, time.monotonic()
            for it in range(ALLREDUCE_ITERS):
                inputs = [
                    np.random.default_rng(size * 31 + it * 2 + r).standard_normal(n).astype(np_type)
                    for r in (0, 1)
                ]
                want = reference.all_reduce(inputs, code, algorithm).view(np.uint8)
                got = comm.all_reduce(inputs[args.rank], algorithm)
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
        f"{len(runs) * ALLREDUCE_ITERS} all-reduces (exchange, ring; float32, float16; 1 KiB..4 MiB) "
        "byte-identical to the reference, 0 mismatches"
    )


def step_cmdring(args: argparse.Namespace) -> str:
    from transport.command_ring import CommandRing, host_memory

    runs, mismatches = [], 0
    with _communicator(args, "cmdring") as comm:
        ring = CommandRing(comm, host_memory(2 * max(ALLREDUCE_SIZES) + 4096), spin_us=50)
        for algorithm, (np_type, code), size in itertools.product(
            ("exchange", "ring"), ((np.float32, F32), (np.float16, F16)), ALLREDUCE_SIZES
        ):
            n = size // np.dtype(np_type).itemsize
            inputs = [np.random.default_rng(size * 37 + r).standard_normal(n).astype(np_type) for r in (0, 1)]
            want = reference.all_reduce(inputs, code, algorithm).view(np.uint8)
            bad = int(not np.array_equal(ring.all_reduce(inputs[args.rank], algorithm).view(np.uint8), want))
            mismatches += bad
            runs.append({"collective": "all_reduce", "algorithm": algorithm, "dtype": np.dtype(np_type).name,
                         "size_bytes": size, "mismatches": bad})  # fmt: skip
        blocks = [_pattern(4096, r).view(np.float32) for r in (0, 1)]
        got = ring.all_gather(blocks[args.rank]).view(np.uint8)  # random bytes: compare bits (NaN too)
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
    "allreduce": step_allreduce,
    "cmdring": step_cmdring,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--rank", type=int, choices=(0, 1), required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--device", default="rxe0")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(STEPS[args.step](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
