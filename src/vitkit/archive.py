"""A folder's files in one ``.tar.gz`` that is the same bytes for the same files (fixed times and owners), and
read back safely: the state a long computation carries from one machine's lease to the next
(``vitkit reproduce --state``, ``benchmarks/fmnist_record.py --state``).

Reading refuses, before writing anything, an archive that is not one, holds a link or a device, a path outside
its one top folder, or more than it may unpack to; a file already in the destination wins over the archive's
(the folder may be further on than the archive).
"""
from __future__ import annotations

import gzip
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import List, Sequence, Tuple

from .errors import DataError
from .utils import PathLike, atomic_path

MAX_BYTES = 4 << 30  # what an archive may unpack to: records and a few models are far below it
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")  # a model's files: kept only while still read
DRAWN = (".png", ".svg", ".pdf")  # plots: drawn again from the records a state keeps, never archived


def write_archive(path: PathLike, members: Sequence[Tuple[str, Path]]) -> int:
    """Write ``members`` ((name in the archive, file), in that order) to ``path`` atomically; its size."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, f in members:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = f.stat().st_size, 0o644, 0
                with open(f, "rb") as src:
                    tar.addfile(info, src)
    return Path(path).stat().st_size


def read_archive(path: PathLike, dest: PathLike, top: str, *, what: str,
                 max_bytes: int = MAX_BYTES) -> Tuple[int, List[Path]]:
    """Restore the files of ``path`` (all under ``top/``) into ``dest`` (``top/a/b`` -> ``dest/a/b``), each
    one ``dest`` lacks. Returns (how many were restored, every file's path in ``dest``). ``what`` names the
    archive in the one-line :class:`DataError` of a damaged or hostile one."""
    path, dest = Path(path), Path(dest)
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            _check(path, members, top, what, max_bytes)
            restored, files = 0, []
            for m in members:
                if m.isdir():
                    continue
                out = dest.joinpath(*PurePosixPath(m.name).parts[1:])
                if not out.exists():
                    with atomic_path(out) as tmp, open(tmp, "wb") as f:
                        shutil.copyfileobj(tar.extractfile(m), f)
                    restored += 1
                files.append(out)
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeDecodeError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a readable {what} ({type(err).__name__}: {err})") from None
    return restored, files


def _check(path: Path, members: List[tarfile.TarInfo], top: str, what: str, max_bytes: int) -> None:
    total = 0
    for m in members:
        parts = PurePosixPath(m.name).parts
        if not (m.isfile() or m.isdir()):
            raise DataError(f"{path}: {m.name!r} is a link or a device, which a {what} never holds")
        if m.name.startswith("/") or ".." in parts or parts[:1] != (top,) or (m.isfile() and len(parts) < 2) \
                or "\\" in m.name:
            raise DataError(f"{path}: {m.name!r} lies outside the {top}/ folder of a {what}")
        total += m.size
    if total > max_bytes:
        raise DataError(f"{path}: would unpack to {total / 2**30:.1f} GiB, more than a {what} holds "
                        f"({max_bytes / 2**30:.0f} GiB)")
