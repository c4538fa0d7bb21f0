"""The ``vitkit`` command line: thin wrappers that parse arguments and call one library function each.

Each command group lives in its own module with a ``register(subparsers)``
function; add new groups to COMMAND_MODULES.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

from .. import __version__

COMMAND_MODULES = ["model", "checkpoints", "analysis", "train", "mpp", "bench", "reproduce"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="The Vision Transformer (Dosovitskiy et al., ICLR 2021): build, load, "
        "train, evaluate and inspect ViTs.")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as err:  # user-facing errors: one clear line
        if getattr(args, "debug", False):
            raise
        print(f"vitkit {args.command}: error: {err}", file=sys.stderr)
        return 1
