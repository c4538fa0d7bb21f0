"""Small shared utilities (no model code)."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import socket
import zlib
from pathlib import Path
from typing import Any, Iterator, Union

PathLike = Union[str, os.PathLike]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed over ``path`` atomically.

    A crash or exception leaves any previous file at ``path`` untouched. The file is created with the
    permissions any tool gives a new file (0666 less the umask). Its name carries the writer's process id
    and machine (``.NAME.PID-HOST.XXXXXXXX.tmp``), so temporary files left by a killed writer are removed on the
    next write to the same file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(path)
    while True:
        tmp_path = path.parent / f".{path.name}.{_writer_id()}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _writer_id() -> str:
    """``PID-HOST``: this process, and a short hash of this machine's name (a shared folder may be written
    from several machines; only this machine's processes can be checked)."""
    return f"{os.getpid()}-{zlib.crc32(socket.gethostname().encode()):08x}"


def _remove_orphans(path: Path) -> None:
    """Delete ``.NAME.PID-HOST.*.tmp`` files next to ``path`` left by a process of this machine that no
    longer exists."""
    host = _writer_id().split("-")[1]
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid, _, their_host = tmp.name[len(path.name) + 2:].split(".", 1)[0].partition("-")
        if pid.isdigit() and their_host == host and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


def _alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill would terminate the process there: assume it is alive
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def write_json_atomic(path: PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
