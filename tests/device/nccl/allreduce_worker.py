"""Two-rank all-reduce through whatever libnccl.so.2 the process loaded (the lane preloads ours).

    python allreduce_worker.py RESULT.json

Spawns two rank processes, rank r on GPU r % count: one GPU per rank where there are two, else
both on one GPU, each with its own NCCL_HOSTID so NCCL connects them through its socket
transport (transport.gpu.nccl_rank_env). Each rank all-reduces (SUM, float32) a constant
tensor and a seeded random one at a few sizes; every rank checks every element against the sum
computed on the CPU (with two ranks a float sum is exact), and reports which libnccl it loaded.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from pathlib import Path
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from transport.gpu import nccl_rank_env

SIZES = (1024, 1 << 20, 16 << 20)  # elements: 4 KiB, 4 MiB, 64 MiB
WORLD = 2


def loaded_nccl() -> str:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        paths = {line.split()[-1] for line in maps if "libnccl" in line}
    return ",".join(sorted(paths))


def runtime_nccl_version() -> int:
    """ncclGetVersion as the process resolves it (torch.cuda.nccl.version() is the build-time header)."""
    version = ctypes.c_int()
    assert ctypes.CDLL(None).ncclGetVersion(ctypes.byref(version)) == 0
    return version.value


def seeded(rank: int, size: int) -> torch.Tensor:
    return torch.randn(size, generator=torch.Generator().manual_seed(1000 + rank))


def rank_main(rank: int, port: int, queue) -> None:
    gpus = torch.cuda.device_count()
    os.environ.update(nccl_rank_env(rank, WORLD, gpus))
    torch.cuda.set_device(rank % gpus)
    device = torch.device("cuda", rank % gpus)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, device_id=device
    )
    checks = []
    for size in SIZES:
        constant = torch.full((size,), float(rank + 1), device=device)
        dist.all_reduce(constant)
        random = seeded(rank, size).to(device)
        dist.all_reduce(random)
        expected = sum(seeded(r, size) for r in range(WORLD))
        torch.cuda.synchronize()
        checks.append(
            {
                "elements": size,
                "constant_ok": bool(torch.all(constant == float(sum(range(1, WORLD + 1)))).item()),
                "random_mismatches": int((random.cpu() != expected).sum().item()),
            }
        )
    queue.put(
        {
            "rank": rank,
            "nccl_version": runtime_nccl_version(),
            "libnccl": loaded_nccl(),
            "checks": checks,
            "gpu": rank % gpus,
            "nccl_hostid": os.environ.get("NCCL_HOSTID"),
        }
    )
    dist.destroy_process_group()


def main(out: str) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(rank, port, queue)) for rank in range(WORLD)]
    for proc in procs:
        proc.start()
    results = []
    try:
        for _ in procs:
            results.append(queue.get(timeout=300))
    except Empty:
        pass  # a rank died: its exit code below says so
    for proc in procs:
        proc.join(timeout=60)
    results.sort(key=lambda r: r["rank"])
    report = {
        "exit_codes": [proc.exitcode for proc in procs],
        "ranks": results,
        "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_") or k == "LD_PRELOAD"},
    }
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    return 0 if report["exit_codes"] == [0] * WORLD and len(results) == WORLD else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
