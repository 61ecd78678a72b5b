"""The ``vllm.general_plugins`` entry point: check every patch, then install, or stop vLLM.

vLLM runs this function in every process it starts (API server, engine core, workers,
headless nodes). Checks happen here, not at import: vLLM only logs an exception raised
while a plugin module is imported and starts anyway. The expected hashes are the overlay pins
of the image this process runs in (``registry.load_pins``: its image record, built from the
lock). A refusal writes one message naming the patch, the expected and the found hash (or the
missing pins and the fix) to stderr and leaves with ``os._exit``, which no ``except`` in vLLM's
call chain can swallow.

``SPARKRING_OVERLAY_MODE``: ``disabled`` (checks nothing, patches nothing), ``shadow`` or
``custom``; unset means the overlay is not part of this launch (a plain ``vllm serve`` on a
machine where the package is installed) and it does nothing either.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from typing import NoReturn

from overlay import registry

EXIT_REFUSED = 78  # EX_CONFIG: the installed vLLM is not the one the overlay was written for
UNPINNED_FIX = (
    "pin it (ansible-playbook playbooks/overlay-pins.yml --check --diff shows each patched function against "
    "the source its wrapper was written for; then without --check, and rebuild the image with playbooks/image.yml) "
    "or set OVERLAY_MODE=disabled in the launch profile to run it without the overlay"
)
MODES = ("disabled", "shadow", "custom")
_state = {"registered": False}


def refuse(message: str) -> NoReturn:
    """Stop this process now with ``message``; nothing above us may catch it."""
    sys.stderr.write(f"sparkring overlay: REFUSING TO START: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_REFUSED)


def current_platform_kind() -> str:
    """``cpu`` or ``cuda``: which communicator this vLLM process uses."""
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda_alike() else "cpu"


def install(patch: registry.Patch) -> None:
    """Replace ``patch.module.patch.qualname`` with ``wrapper(stock)``."""
    owner: object = importlib.import_module(patch.module)
    *path, attr = patch.qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    stock = getattr(owner, attr)
    if getattr(stock, "sparkring_patch", None) == patch.name:
        return  # already installed in this process
    factory_module, factory = patch.wrapper.rsplit(".", 1)
    wrapper = getattr(importlib.import_module(factory_module), factory)(stock)
    wrapper.sparkring_patch = patch.name
    setattr(owner, attr, wrapper)


def register() -> None:
    """The entry point (``[project.entry-points."vllm.general_plugins"] sparkring_overlay``)."""
    if _state["registered"]:
        return
    _state["registered"] = True
    mode = os.environ.get("SPARKRING_OVERLAY_MODE")
    if mode is None or mode == "disabled":
        return
    if mode not in MODES:
        refuse(f"SPARKRING_OVERLAY_MODE={mode!r} is not one of {', '.join(MODES)}")
    if not (os.environ.get("SPARKRING_RING_SPEC") or os.environ.get("SPARKRING_RING_PREFIX")):
        refuse(f"mode {mode} needs the ring: set SPARKRING_RING_SPEC (the overlay role's ring.json)")
    version = importlib.metadata.version("vllm")
    try:
        pins = registry.load_pins()
    except registry.PinsError as exc:
        refuse(f"{exc} (vLLM {version}); {UNPINNED_FIX}")
    if pins is None:
        refuse(
            f"this image has no overlay pins for its vLLM {version} ({registry.image_json_path()}); {UNPINNED_FIX}"
        )
    if pins.vllm_version != version:
        refuse(
            f"vLLM {version} is installed, but this image's overlay pins are for vLLM {pins.vllm_version}; {UNPINNED_FIX}"
        )
    patches = registry.patches_for(pins.wrappers)
    if not patches:
        refuse(
            f"the image's pins name wrappers for vLLM {pins.wrappers}, and this overlay has wrappers for "
            f"{', '.join(registry.WRAPPED_RELEASES)} only; rebuild the image from the lock (playbooks/image.yml)"
        )
    mismatches = registry.verify(patches, pins)
    if mismatches:
        refuse("; ".join(str(m) for m in mismatches) + f" (vLLM {version}); nothing was patched")
    platform = current_platform_kind()
    for patch in patches:
        if patch.platform not in (platform, "any"):
            continue
        try:
            install(patch)
        except Exception as exc:  # any install failure must stop the process, never half-patch it
            refuse(f"patch {patch.name!r} failed to install: {type(exc).__name__}: {exc}")
    from overlay.collectives import MODE
    from overlay.recorder import RECORDER

    MODE["mode"] = RECORDER.mode = mode
    RECORDER.install_triggers()
