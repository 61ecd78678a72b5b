"""Controller-side filter: the launch profile and a rank's hostvars -> that rank's exact spec.

It only calls `sparkring.launch_spec.render_rank_spec` (the one renderer) so the argv that
`--check --diff` shows, the one the attestation records and the one that starts are the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError
from sparkring.launch_spec import LaunchRefused, NodeCapabilities, container_name, render_rank_spec
from sparkring.lock import LOCK_PATH, load_lock
from sparkring.profile import ProfileError, load_profile_file

HOSTVARS = (
    "sparkring_rank",
    "sparkring_world_size",
    "sparkring_cluster_name",
    "sparkring_fabric",
    "sparkring_management",
    "sparkring_ports",
)


def _plain(hostvars: Any, what: str) -> dict[str, Any]:
    """The contract's hostvars as plain JSON types (Ansible hands over lazy, tagged values)."""
    try:
        return json.loads(json.dumps({key: hostvars[key] for key in HOSTVARS}, default=str))
    except KeyError as missing:
        raise AnsibleFilterError(
            f"sparkring_rank_spec: {what} lacks hostvar {missing}; is it a ring rank?"
        ) from None


def sparkring_rank_spec(
    rank_vars: Any,
    head_vars: Any,
    profile_path: str,
    node: dict,
    image: str,
    flavor: str,
    lock_path: str = str(LOCK_PATH),
) -> dict[str, Any]:
    """`{{ hostvars[inventory_hostname] | sparkring_rank_spec(head_hostvars, profile, node, image, image_flavor) }}`

    `flavor` is the runtime image's flavor (the inventory's image_flavor: upstream, fork or sim);
    `lock_path` (default: images/lock.json) supplies the overlay pins of that image."""
    if not image:
        raise AnsibleFilterError("sparkring_rank_spec: no image reference; run the image stage first")
    try:
        profile = load_profile_file(profile_path)
        capabilities = NodeCapabilities(
            gpu=bool(node["gpu"]), infiniband=bool(node["infiniband"]), cpu_count=int(node["cpu_count"])
        )
        spec = render_rank_spec(
            profile,
            _plain(rank_vars, "the rank"),
            _plain(head_vars, "the head"),
            capabilities,
            image,
            flavor,  # type: ignore[arg-type]  # checked by render_rank_spec, naming image_flavor
            load_lock(Path(lock_path)),
        )
    except (ProfileError, OSError) as error:
        raise AnsibleFilterError(f"launch profile {profile_path}:\n{error}") from None
    except LaunchRefused as refusal:
        raise AnsibleFilterError(f"launch refused before anything was touched: {refusal}") from None
    except ValueError as error:  # the lock failed its schema
        raise AnsibleFilterError(f"{lock_path}: {error}") from None
    serve = spec.vllm_argv
    return spec.as_dict() | {
        "profile_sha256": spec.labels["sparkring.profile_sha256"],
        "served_model_name": serve[serve.index("--served-model-name") + 1],
        "api_port": profile.api_port,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sparkring_rank_spec": sparkring_rank_spec, "sparkring_container_name": container_name}
