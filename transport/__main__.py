"""Command line: ``python -m transport probe --help``."""

from __future__ import annotations

import argparse
import sys

from transport import probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transport", description="SparkRing ring transport tools")
    sub = parser.add_subparsers(dest="command", required=True)
    probe.add_arguments(sub.add_parser("probe", help="qualify ring links and burn collectives (JSON out)"))
    args = parser.parse_args(argv)
    return probe.run(args)


if __name__ == "__main__":
    sys.exit(main())
