"""Small shared utilities (no model code)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, Union

from .errors import BusyError

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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as err:  # e.g. a read-only folder: name the file we wanted, not the temporary one
        from .errors import OutputError, os_error_hint
        raise OutputError("could not be written", path=path, hint=os_error_hint(err.errno)) from err
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; a written file gets what any tool gives it
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except Exception as err:
        failed = _write_failure(err, path, tmp_path)
        if failed is None:
            raise
        raise failed from err
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    """The process umask, read without changing it where the system says (Linux), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_failure(err: Exception, path: Path, tmp: Path) -> Any:
    """An error of a writer inside :func:`atomic_path` as an OutputError naming ``path``, when the writer
    failed because the file could not be written (full disk, file-size limit, permissions): Python
    raises OSError without the file name, safetensors raises its own error with "os error N", torch's
    zip writer reports a short write as "unexpected pos". Other errors are not ours to rename (None)."""
    from .errors import OutputError, os_error_hint

    if isinstance(err, OSError):  # about the file being written, not another one
        code = err.errno if err.filename in (None, str(tmp), tmp) else None
    else:
        found = re.search(r"os error (\d+)", str(err))
        code = int(found.group(1)) if found else None
        if code is None and "unexpected pos" in str(err):  # torch.save: the file is shorter than written
            return OutputError("the file could not be written completely", path=path,
                               hint="the disk is full or a file-size limit was reached: free some space or "
                                    "write elsewhere")
    if code is None:
        return None
    return OutputError("could not be written", path=path, hint=os_error_hint(code))


@contextlib.contextmanager
def staged_output(path: PathLike) -> Iterator[Path]:
    """For a new output that may be a folder of several files (a converted checkpoint): yield a path of
    the same name inside a temporary folder beside ``path`` and move what was written there to ``path``
    only when the block succeeds, so a failure (a full disk, a bad input found late) leaves nothing. An
    existing ``path`` is written in place (its files are then replaced one by one, each atomically)."""
    import shutil

    path = Path(path)
    if path.exists() or path.is_symlink():
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent))
    try:
        yield stage / path.name
        if (stage / path.name).exists():
            os.replace(stage / path.name, path)
    except Exception as err:  # name the real output in messages, not the staging folder
        where = getattr(err, "path", None)
        if where is not None and str(where).startswith(str(stage / path.name)):
            err.path = Path(str(path) + str(where)[len(str(stage / path.name)):])
        raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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


@contextlib.contextmanager
def exclusive(lock: PathLike, *, wait: bool = True, busy: str = "") -> Iterator[None]:
    """An advisory lock on the file ``lock`` (``filelock``: ``flock`` on POSIX, ``msvcrt`` locking on Windows),
    released when the block ends or the process dies. ``wait=False``: raise :class:`~vitkit.errors.BusyError`
    (``busy``) at once when another process (or another lock on the same file) holds it."""
    from filelock import FileLock, Timeout
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = FileLock(str(lock), timeout=-1 if wait else 0)
    try:
        held.acquire()
    except Timeout:
        raise BusyError(busy or f"{lock} is held by another process") from None
    try:
        yield
    finally:
        held.release()
