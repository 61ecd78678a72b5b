#!/usr/bin/python
"""Ansible module: build SparkRing's switchless-ring NCCL from a pinned source, with attestation."""

# Ansible modules document themselves before their imports.
# ruff: noqa: E402

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparkring_nccl_build
short_description: Build the patched (or stock) NCCL from a pinned source and attest the result
description:
  - Verifies the NCCL source archive and every patch against the sha256 pinned in
    C(images/lock.json) (or, for a source pinned by O(source_tree_sha256), the unpacked tree
    against its digest), unpacks the source, checks the sha256 of every file a patch touches
    just before that patch (its C(Preimage-SHA256) lines), applies the patch with
    C(patch --fuzz=0), runs C(make src.build) with C(NVCC_GENCODE), and installs
    C(lib/libnccl.so.2) and C(attestation.json) into O(dest) in one directory swap.
  - The attestation records the source and patch sha256s, the preimages, the compiler versions,
    the build flags and the library's sha256. The launch mounts O(dest) read-only and preloads
    C(<dest>/lib/libnccl.so.2); launch attestation compares that sha256 across ranks.
  - Same inputs (source, patches, compilers, flags) and an intact library mean no rebuild
    (C(changed=false)). A library whose sha256 no longer matches its attestation is rebuilt.
  - Any refusal names the input that failed in C(field) (C(source_sha256), C(source_dir),
    C(source_tree_sha256), C(preimage), C(patches), C(cuda_home), C(build)).
version_added: "0.1.0"
author: SparkRing
options:
  version:
    description: The NCCL release, as keyed in the lock (for example C(2.29.7-1)).
    type: str
    required: true
  source_archive:
    description: The source archive on the node.
    type: path
    required: true
  source_sha256:
    description:
      - The archive's pinned sha256. Empty or null with no O(source_tree_sha256) either means
        the release is not pinned, and the module refuses to build it.
    type: str
  source_tree_sha256:
    description:
      - The pinned digest of the unpacked source tree (sha256 over sorted C(name NUL file-sha256
        LF) lines), for sources whose archive bytes depend on who packed them (GitHub's
        archives). Checked on every unpack, before any patch; part of the build identity.
    type: str
  source_dir:
    description: The one top directory inside the archive.
    type: str
    required: true
  patches:
    description: The patches, applied in order. Empty builds stock NCCL (the patch-free mode).
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: The patch file on the node., type: path, required: true}
      sha256: {description: Its pinned sha256., type: str, required: true}
  dest:
    description: Where C(lib/libnccl.so.2) and C(attestation.json) are installed.
    type: path
    required: true
  work_dir:
    description: Scratch space for the unpacked source and the build (removed after a build).
    type: path
    default: /var/lib/sparkring/nccl/build
  nvcc_gencode:
    description: C(NVCC_GENCODE) for the device code; sm_121 is the GB10 of a DGX Spark.
    type: str
    default: -gencode=arch=compute_121,code=sm_121
  only_funcs:
    description:
      - NCCL's C(ONLY_FUNCS) filter of the device kernels (for example C(AllReduce Sum f32 * *));
        empty builds them all. Part of the build identity.
    type: str
    default: ""
  cuda_home:
    description: The CUDA toolkit (C(bin/nvcc) under it).
    type: path
    default: /usr/local/cuda
  jobs:
    description: Parallel make jobs; 0 means one per CPU. Not part of the build identity.
    type: int
    default: 0
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Verifies the archive (or its tree), the patches and their preimages, and reports what would be built.
  diff_mode:
    support: full
    details: Shows the attestation before and after (in check mode, the planned inputs).
  platform:
    platforms: posix
notes:
  - Needs C(make), C(patch), C(strip), C(g++) and the CUDA toolkit on the node. The archive, the
    patches and their preimages are verified first (on a scratch copy), so a wrong input is
    refused as such on any node, before the toolchain is looked for.
  - In check mode, an archive or patch not yet on the node (the role copies them first) is
    reported, not refused; everything present is verified.
  - NCCL embeds its build paths, so O(work_dir) is part of the build identity. Keep it the same
    on every rank and two ranks' builds of the same inputs are byte-identical.
  - A full build takes minutes. C(<work_dir>/progress.json) says what the module is doing (its
    C(phase)) - verifying the inputs, up to date, or, every 10 s while make runs, the minutes so
    far and the last line of C(build.log) in the build tree; run the module with C(async) to
    watch it. A failed build keeps the log and quotes its end. Check mode writes no progress.
"""

EXAMPLES = r"""
- name: Build the switchless-ring NCCL for GB10
  sparkring_nccl_build:
    version: 2.29.7-1
    source_archive: /var/lib/sparkring/nccl/src/nvidia-nccl_2.29.7-1.orig.tar.gz
    source_sha256: e67239212c395bfdb398a7519491840d06fdf6b599c299f97c7ed0109777bba1
    source_dir: nccl-2.29.7-1
    patches:
      - path: /var/lib/sparkring/nccl/patches/2.29.7-1/0001-skip-tree-pat-connect.patch
        sha256: 8da5e77ecc52922b0d93b8c280016b0f35f91c8efb978ca4b76466589f5f23c8
    dest: /opt/sparkring/nccl/2.29.7-1
"""

RETURN = r"""
library:
  description: The library the launch preloads.
  type: str
  returned: always
  sample: /opt/sparkring/nccl/2.29.7-1/lib/libnccl.so.2
sha256:
  description: The library's sha256 (null in check mode when a build is due).
  type: str
  returned: always
inputs_sha256:
  description: sha256 of the build inputs (source, patches, compilers, flags).
  type: str
  returned: always
attestation:
  description: The attestation of the installed build (the planned inputs in check mode).
  type: dict
  returned: always
attestation_path:
  description: Where the attestation lies.
  type: str
  returned: always
field:
  description: On failure, the input that failed.
  type: str
  returned: failure
"""

import json
import os
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sparkring_integrity import write_json_atomic
from ansible.module_utils.sparkring_nccl import (
    ATTESTATION,
    LIBRARY,
    PROGRESS,
    BuildRequest,
    NcclBuildError,
    PatchSpec,
    apply_patches,
    build,
    check_pins,
    compiler_versions,
    is_current,
    read_attestation,
    unpack_pinned,
)


class NcclBuilder:
    """One build request on this node: verify the inputs, then decide, plan (check mode) or build."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        params = module.params
        self.request = BuildRequest(
            version=params["version"],
            source_archive=params["source_archive"],
            source_sha256=params["source_sha256"],
            source_tree_sha256=params["source_tree_sha256"],
            source_dir=params["source_dir"],
            patches=[PatchSpec(p["path"], p["sha256"]) for p in params["patches"]],
            dest=params["dest"],
            work_dir=params["work_dir"],
            nvcc_gencode=params["nvcc_gencode"],
            only_funcs=params["only_funcs"],
            cuda_home=params["cuda_home"],
            jobs=params["jobs"],
        )

    def run(self, argv: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str, str]:
        return self.module.run_command(argv, cwd=cwd, environ_update={"LANG": "C", "LC_ALL": "C", **env})

    def verify_inputs(self) -> None:
        """What a build would refuse short of compiling: the layout and preimages, on a scratch copy."""
        with tempfile.TemporaryDirectory(prefix="sparkring-nccl-plan-") as scratch:
            tree = unpack_pinned(self.request, Path(scratch))
            apply_patches(tree, self.request.patches, self.run)

    def absent_inputs(self) -> list[str]:
        paths = [self.request.source_archive, *(p.path for p in self.request.patches)]
        return [path for path in paths if not os.path.isfile(path)]

    def progress(self, phase: str) -> None:
        """What a watcher of <work_dir>/progress.json sees (the make phases come from build())."""
        if not self.module.check_mode:
            os.makedirs(self.request.work_dir, exist_ok=True)
            write_json_atomic(os.path.join(self.request.work_dir, PROGRESS), {"phase": phase})

    def execute(self) -> dict:
        request = self.request
        self.progress("verifying the source and the patches")
        # Inputs first: a wrong source or patch is refused on any node, before the toolchain is asked.
        self.module.get_bin_path("patch", required=True)
        absent = self.absent_inputs() if self.module.check_mode else []
        if not absent:
            check_pins(request)
            self.verify_inputs()
        for tool in ("make", "strip", "g++"):
            self.module.get_bin_path(tool, required=True)
        request.compilers = compiler_versions(request.cuda_home, self.run)
        before = read_attestation(request.dest)
        library = os.path.join(request.dest, LIBRARY)
        result = {
            "library": library,
            "inputs_sha256": request.identity(),
            "attestation_path": os.path.join(request.dest, ATTESTATION),
        }
        if is_current(request, before):
            self.progress(f"up to date: {library} is this build")
            return result | {"changed": False, "sha256": before["output"]["sha256"], "attestation": before}
        if self.module.check_mode:
            after = {"inputs_sha256": request.identity(), **request.inputs()}
            msg = (
                f"would build NCCL {request.version} with {len(request.patches)} patch(es) for "
                f"{request.nvcc_gencode} into {library}"
            )
            if absent:
                msg += f" (not on the node yet, their pins are checked when they arrive: {', '.join(absent)})"
        else:
            after = build(request, self.run)
            msg = f"built NCCL {request.version} into {library}"
        result |= {
            "changed": True,
            "msg": msg,
            "attestation": after,
            "sha256": after.get("output", {}).get("sha256"),
        }
        if self.module._diff:
            result["diff"] = {
                "before_header": result["attestation_path"],
                "after_header": result["attestation_path"],
                "before": json.dumps(before, indent=2, sort_keys=True) + "\n" if before else "",
                "after": json.dumps(after, indent=2, sort_keys=True) + "\n",
            }
        return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "version": {"type": "str", "required": True},
            "source_archive": {"type": "path", "required": True},
            "source_sha256": {"type": "str"},
            "source_tree_sha256": {"type": "str"},
            "source_dir": {"type": "str", "required": True},
            "patches": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "path": {"type": "path", "required": True},
                    "sha256": {"type": "str", "required": True},
                },
            },
            "dest": {"type": "path", "required": True},
            "work_dir": {"type": "path", "default": "/var/lib/sparkring/nccl/build"},
            "nvcc_gencode": {"type": "str", "default": "-gencode=arch=compute_121,code=sm_121"},
            "only_funcs": {"type": "str", "default": ""},
            "cuda_home": {"type": "path", "default": "/usr/local/cuda"},
            "jobs": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    try:
        result = NcclBuilder(module).execute()
    except NcclBuildError as error:
        module.fail_json(msg=f"{error.field}: {error}", field=error.field)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
