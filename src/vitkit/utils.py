"""Small shared utilities (no model code)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, Union

PathLike = Union[str, os.PathLike]


TEMP_SUFFIX = ".tmp"
_TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + "$")  # .NAME.XXXXXXXX.tmp


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed over ``path`` atomically.

    A crash or exception leaves any previous file at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json_atomic(path: PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def remove_stale_temps(folder: PathLike) -> List[Path]:
    """Delete the temporary files :func:`atomic_path` left in ``folder`` (and below) when a process was
    killed in the middle of a write; returns what was removed. Only for folders no other process is
    writing to (a run being resumed)."""
    removed = []
    root = Path(folder)
    if not root.is_dir():
        return removed
    for p in root.rglob(f"*{TEMP_SUFFIX}"):
        if _TEMP_NAME.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink()
            removed.append(p)
    return removed
