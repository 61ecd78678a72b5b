"""Run by the vLLM under test (not by pytest): what the overlay's wrappers assume of it, as facts.

Signatures of every patched function, what the CPU collectives return (in place or a new
tensor, on a real one-rank gloo group), what the CUDA all-reduce returns (from its source; no
GPU here), the group names tensor and decode-context parallelism get, the attributes the
wrappers read. Prints one JSON object; tests/vllm/overlay/test_overlay_pins.py compares it with
what the wrappers for that release expect.
"""

import ast
import inspect
import json
import tempfile
import textwrap

import torch
import torch.distributed as dist
from vllm.distributed import parallel_state
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
from vllm.v1.attention.ops import dcp
from vllm.v1.core.sched.scheduler import Scheduler


def params(f):
    return [
        [p.name, None if p.default is p.empty else repr(p.default)]
        for p in inspect.signature(f).parameters.values()
    ]


def returns(f):
    tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    return sorted(
        {ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None}
    )


def assigned_attrs(f):
    tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    return sorted(
        {
            t.attr
            for n in ast.walk(tree)
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
        }
    )


facts = {
    "signatures": {
        "CpuCommunicator.all_reduce": params(CpuCommunicator.all_reduce),
        "CpuCommunicator.all_gather": params(CpuCommunicator.all_gather),
        "CudaCommunicator.all_reduce": params(CudaCommunicator.all_reduce),
        "CudaCommunicator.all_gather": params(CudaCommunicator.all_gather),
        "cp_lse_ag_out_rs": params(dcp.cp_lse_ag_out_rs),
        "Scheduler.make_spec_decoding_stats": params(Scheduler.make_spec_decoding_stats),
    },
    "cuda_all_reduce_returns": returns(CudaCommunicator.all_reduce),
    "scheduler_init_sets": [
        a for a in ("num_spec_tokens", "dynamic_sd_lookup") if a in assigned_attrs(Scheduler.__init__)
    ],
    "mask_dcp_empty_shards_": callable(getattr(dcp, "mask_dcp_empty_shards_", None)),
    "group_names": [
        n
        for n in ("tp", "dcp")
        if f'group_name="{n}"' in inspect.getsource(parallel_state.initialize_model_parallel)
    ],
    "unique_name_of_tp": parallel_state._get_unique_name("tp"),
}
with tempfile.TemporaryDirectory() as tmp:
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    comm = CpuCommunicator(dist.group.WORLD, unique_name=parallel_state._get_unique_name("dcp"))
    x = torch.arange(4.0)
    facts["cpu_all_reduce_returns_its_input"] = comm.all_reduce(x) is x
    g = comm.all_gather(x.reshape(2, 2), dim=-1)
    facts["cpu_all_gather_returns_a_new_tensor"] = g.data_ptr() != x.data_ptr()
    facts["communicator_attributes"] = {
        a: getattr(comm, a) for a in ("unique_name", "world_size", "rank_in_group")
    }
    dist.destroy_process_group()
print(json.dumps(facts, sort_keys=True))
