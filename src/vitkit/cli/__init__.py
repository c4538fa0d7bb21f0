"""The ``vitkit`` command line: thin wrappers that parse arguments and call one library function each.

Each command group lives in its own module with a ``register(subparsers)`` function; add new groups to
COMMAND_MODULES.

:func:`main` is the one error boundary, and the exception's type alone decides: an expected failure (a
:class:`~vitkit.errors.VitkitError`, or an operating-system error such as a missing file or a full disk)
becomes one line ``vitkit COMMAND: error: ...`` and the type's exit code (1; 2 for usage errors);
anything else is a bug and shows its traceback with a request to report it (exit code 70).
``--debug`` shows the traceback of every error.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
import traceback
import warnings
from typing import List, Optional, Tuple

from ..errors import EXIT_BUG, EXIT_ERROR, VitkitError, VitkitWarning, describe_os_error
from ..models.kernel_plan import use_backend
from ..version import __version__

COMMAND_MODULES = ["model", "checkpoints", "analysis", "train", "mpp", "bench", "reproduce", "serve", "backend"]


BACKEND_HELP = ("the kernels to run, e.g. gemm=aten,attention=explicit (fields gemm, attention, int8; each auto "
                "or fixed; default: $VITKIT_BACKEND, else all auto); `vitkit backend` shows what auto resolves to")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vitkit", description="The Vision Transformer (Dosovitskiy et al., ICLR 2021): build, load, "
        "train, evaluate and inspect ViTs.",
        epilog="Exit codes: 0 success, 1 an error (reported in one line), 2 a usage error, 3 some of many "
        "files failed (each reported, the rest processed), 70 a bug in vitkit (traceback shown).")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    parser.add_argument("--backend", metavar="SPEC", default=None, help=BACKEND_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    for p in sub.choices.values():  # `vitkit CMD ... --debug` as well as `vitkit --debug CMD ...`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of any error")
        p.add_argument("--backend", metavar="SPEC", default=argparse.SUPPRESS, help=BACKEND_HELP)
    return parser


def classify_failure(err: BaseException) -> Tuple[int, Optional[str]]:
    """(exit code, one-line message) of an expected failure; (EXIT_BUG, None) for a bug in vitkit."""
    if isinstance(err, VitkitError):
        return err.exit_code, str(err)
    if isinstance(err, OSError):
        return EXIT_ERROR, describe_os_error(err)
    return EXIT_BUG, None


def _one_line(text: str) -> str:
    if "Original Traceback" in text:  # re-raised from a DataLoader worker: keep the worker's own message
        last = [ln for ln in text.splitlines() if ln.strip()][-1]
        text = re.sub(r"^[A-Za-z_][\w.]*: ", "", last.strip())
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _tolerant_output() -> None:
    """File names that are not valid UTF-8 (kept by Python as surrogates) must print, not crash."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse's usage errors (2), --help and --version (0): a return code
        return stop.code if isinstance(stop.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _tolerant_output()
    where = f"vitkit {args.command}"
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, VitkitWarning):
            print(f"{where}: warning: {_one_line(str(message))}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = show
        try:
            if args.backend is None:  # the backend in force: $VITKIT_BACKEND, else auto
                return int(args.func(args) or 0)
            with use_backend(args.backend):
                return int(args.func(args) or 0)
        except KeyboardInterrupt:
            print(f"{where}: interrupted", file=sys.stderr)
            return 130
        except Exception as err:  # the one error boundary
            code, message = classify_failure(err)
            if message is None:
                traceback.print_exc()
                print(f"{where}: internal error: {type(err).__name__}: {_one_line(str(err))}. This is a bug in "
                      f"vitkit: please report it with the command line and the traceback above.", file=sys.stderr)
                return code
            if args.debug:
                traceback.print_exc()
            print(f"{where}: error: {_one_line(message)}", file=sys.stderr)
            return code
