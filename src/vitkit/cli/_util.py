"""Small helpers shared by the command modules."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from ..errors import NotFoundError, UsageError


def add_command(sub, name: str, help: str, description: Optional[str] = None) -> argparse.ArgumentParser:
    """Subcommand ``name`` of ``sub``, its help and description written as indented paragraphs: their white
    space is folded to single spaces, as argparse folds it when it prints them."""
    return sub.add_parser(name, help=" ".join(help.split()),
                          description=None if description is None else " ".join(description.split()))


def parse_value(text: str) -> Any:
    """'3' -> 3, '0.1' -> 0.1, 'true' -> True, 'none' -> None, '[1,2]' -> [1, 2], '[csv,tensorboard]' ->
    ['csv', 'tensorboard'] (a list of words, YAML's flow form), else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if text.strip().startswith("[") and text.strip().endswith("]"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            pass
    return text


def parse_overrides(items: Iterable[str]) -> Dict[str, Any]:
    """Parse ``key=value`` pairs given with ``--set``."""
    out: Dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got {item!r}", hint="e.g. --set optim.lr=3e-4")
        out[key.strip()] = parse_value(value)
    return out


def _number(kind: type, low: float, strict: bool, what: str):
    """An argparse type: a finite ``kind`` above ``low`` (``strict``) or at least ``low``; anything else is a
    usage error (exit code 2) before any work starts."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value
    parse.__name__ = what.replace(" ", "_")  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, False, "a positive integer")  # sizes, counts
nonneg_int = _number(int, 0, False, "an integer >= 0")  # workers, warm-up calls
positive_float = _number(float, 0.0, True, "a positive number")  # rates, epochs
nonneg_float = _number(float, 0.0, False, "a number >= 0")  # regularisation strengths


class ManyFiles:
    """The one behaviour of commands that take many files (``predict``, ``analyze``): each input that
    cannot be used (missing, not an image, unreadable, a broken link, an empty folder) is reported on
    stderr as ``vitkit CMD: skipped PATH: reason`` and skipped, the others are processed, and
    :meth:`exit_code` says how it went: 0 all were processed, 3 some failed, 1 none could be."""

    def __init__(self, command: str):
        self.command, self.ok, self.failed = command, 0, []

    def skip(self, path: Any, reason: Any) -> None:
        from ..errors import describe_os_error
        is_os = isinstance(reason, OSError) and getattr(reason, "errno", None)
        text = describe_os_error(reason) if is_os else str(reason)
        text = " ".join(text.split())
        shown = str(path)
        if text.startswith(shown):  # the reason already names the file
            text = text[len(shown):].lstrip(": ")
        self.failed.append(shown)
        print(f"vitkit {self.command}: skipped {shown}: {text}", file=sys.stderr, flush=True)

    def images(self, paths: Iterable[Any]) -> List[Path]:
        """Image files from files and folders (folders searched recursively); bad paths skipped and reported."""
        from ..data.preprocess import find_images
        out: List[Path] = []
        for p in map(Path, paths):
            try:
                if p.is_symlink() and not p.exists():
                    raise NotFoundError(f"{p} is a symbolic link that leads nowhere (broken, or a loop)")
                out.extend(find_images([p]))
            except (OSError, ValueError) as err:
                self.skip(p, err)
        return out

    def exit_code(self, what: str = "files", done: str = "processed") -> int:
        from ..errors import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
        if not self.failed:
            return EXIT_OK
        total = self.ok + len(self.failed)
        print(f"vitkit {self.command}: {done} {self.ok} of {total} {what}, {len(self.failed)} skipped "
              f"(listed above)", file=sys.stderr)
        return EXIT_PARTIAL if self.ok else EXIT_ERROR
