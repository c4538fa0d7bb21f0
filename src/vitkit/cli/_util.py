"""Small helpers shared by the command modules."""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable


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
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = parse_value(value)
    return out
