"""Small helpers shared by the command modules."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict, Iterable

from ..errors import UsageError


def parse_value(text: str) -> Any:
    """'3' -> 3, '0.1' -> 0.1, 'true' -> True, 'none' -> None, '[1,2]' -> [1, 2], else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
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


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (sizes, counts); anything else is a usage error (exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
