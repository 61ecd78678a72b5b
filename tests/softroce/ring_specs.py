"""The Soft-RoCE lane's ring: each guest's ring spec, its NICs, and the sockets that cable them.

    ring_specs.py OUT_DIR RANKS TWINS     write OUT_DIR/rank<r>.json for every guest
    ring_specs.py --nics SPEC             one "cable twin" line per NIC of that guest, in NIC order
    ring_specs.py --sockets OUT RANKS TWINS   every cable twin's unix socket path

The geometry is the inventory's sim rule (transport/geometry.py): cable i joins rank i at .1
and rank i+1 at .2 in 198.19.i.0/24, in cage i % 2 (a pair: one cable, cage 0). Each port is a
cage of TWINS twins, as on a Spark: twin 0 carries the address, the others none. NIC k of a guest
is port k // TWINS (cage order), twin k % TWINS; rxe<k> sits on eth<k>. A spec is the transport's
ring spec format (the overlay role's ring.json) plus each port's cable and each twin's interface.
Standard library only: run.sh calls it with the host's python3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def ring_cables(n: int) -> list[tuple[int, int]]:
    """transport.geometry.ring_cables, restated: this file runs outside the package."""
    return [(0, 1)] if n == 2 else [(i, (i + 1) % n) for i in range(n)]


def spec(rank: int, n: int, twins: int) -> dict:
    ports = []
    for cable, (lo, hi) in enumerate(ring_cables(n)):
        if rank not in (lo, hi):
            continue
        mine, theirs = (1, 2) if rank == lo else (2, 1)
        ports.append(
            {
                "cable": cable,
                "cage": 0 if n == 2 else cable % 2,
                "address": f"198.19.{cable}.{mine}",
                "peer_rank": hi if rank == lo else lo,
                "peer_address": f"198.19.{cable}.{theirs}",
            }
        )
    ports.sort(key=lambda port: port["cage"])
    for p, port in enumerate(ports):
        port["twins"] = [
            {
                "interface": f"eth{p * twins + t}",
                "address": port["address"] if t == 0 else None,
                "rdma_device": f"rxe{p * twins + t}",
                "rdma_port": 1,
                "gid_index": "auto",
            }
            for t in range(twins)
        ]
    return {"rank": rank, "world": n, "ports": ports}


def main(argv: list[str]) -> int:
    if argv[0] == "--nics":
        doc = json.loads(Path(argv[1]).read_text())
        for port in doc["ports"]:
            for t in range(len(port["twins"])):
                print(port["cable"], t)
        return 0
    if argv[0] == "--sockets":
        out, n, twins = argv[1], int(argv[2]), int(argv[3])
        for cable in range(len(ring_cables(n))):
            for t in range(twins):
                print(f"{out}/cable{cable}-{t}.sock")
        return 0
    out, n, twins = Path(argv[0]), int(argv[1]), int(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(n):
        (out / f"rank{rank}.json").write_text(json.dumps(spec(rank, n, twins), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
