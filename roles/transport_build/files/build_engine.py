#!/usr/bin/env python3
"""Build (or only inspect) the transport's native libraries on this node; print JSON.

The transport compiles its engine on first use into a cache keyed by the sources, the
compiler and the flags (transport/_native.py). The build stage runs this once per node so
that the first collective does not pay for a compile, and records each library's sha256:

    build_engine.py [--inspect] [--verbs] [--cuda-arch sm_121]  ->  {"needs_build": bool, "libraries": {...}}

`--inspect` only reports what a build would do (check mode); without it, missing
libraries are built. Run with PYTHONPATH at the installed package and
SPARKRING_TRANSPORT_CACHE at the node's cache directory.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inspect", action="store_true", help="report only; build nothing")
    parser.add_argument("--verbs", action="store_true", help="also the verbs engine (needs libibverbs-dev)")
    parser.add_argument("--cuda-arch", help="also the GPU command ring producer for this sm_XY (needs nvcc)")
    args = parser.parse_args()
    from transport import _native
    from transport.integrity import sha256_file

    wanted = _native.node_libraries(args.verbs, args.cuda_arch)
    targets = {lib.name: lib.path() for lib in wanted}
    needs_build = not all(path.exists() for path in targets.values())
    if not args.inspect:
        for lib in wanted:
            lib.build()
    libraries = {
        name: {"path": str(path), "sha256": sha256_file(path) if path.exists() else None}
        for name, path in targets.items()
    }
    json.dump({"needs_build": needs_build, "libraries": libraries}, sys.stdout, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
