"""A campaign's portable state: the runs of an output folder in one ``.tar.gz`` small enough to keep under
version control, so that a campaign longer than one machine's lease goes on from where it stopped on another
machine (``vitkit reproduce --state FILE``).

The archive holds, for every run folder, its records (recipe.yaml, results.json, metrics.jsonl,
provenance.json, measures.json, the model folder's JSON); weights only where a run still to come needs them:
a run not yet measured (interrupted, or killed between training and measuring; with its checkpoint, which
resumes it), a parent whose children are not all measured, and the models the final side-by-side timing
reads. Everything else can be recomputed from what is kept (the class-subset files, the run's plots) or is no
longer read by anything (a measured run's weights and checkpoint). The archive is written with fixed times
and owners, so the same state gives the same bytes.
"""
from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Dict, Iterable, List, Mapping, Set

from ..errors import DataError
from ..utils import PathLike, atomic_path
from .claims import Arm
from .measure import MEASURES, PROVENANCE, code_id, run_code
from .runs import DESIGN, REPLAN, init_folder, run_folder

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
DRAWN = (".png", ".svg", ".pdf")  # a run's plots: drawn from its metrics.jsonl, which the state keeps
MAX_BYTES = 4 << 30  # what an archive may unpack to: a campaign's records and a few models are far below it


def base_name(run: str) -> str:
    """The arm a run folder belongs to (``vit@lr3e-3`` -> ``vit``)."""
    return run.split("@", 1)[0]


def weights_to_keep(root: PathLike, pairs: Iterable[tuple], table: Mapping[str, Arm], *,
                    timed: Iterable[str] = (), first_seed: int = 0, parents_unresolved: Iterable[str] = (),
                    seeds: Iterable[int] = ()) -> Set[Path]:
    """The folders whose weights a later machine needs: each (run, seed) of ``pairs`` not yet measured, with
    its parent's model and its prepared starting weights; the ``first_seed`` run of each ``timed`` run; and,
    while the learning rates are not yet chosen (the runs' names not yet known), every run of an arm named
    in ``parents_unresolved`` at every seed of ``seeds`` whatever its rate."""
    root = Path(root)
    keep: Set[Path] = set()
    for name, seed in pairs:
        if (run_folder(root, name, seed) / MEASURES).is_file():
            continue
        keep.add(run_folder(root, name, seed))
        arm = table.get(name)
        if arm is not None and arm.parent:
            keep.add(run_folder(root, arm.parent, seed))
            keep.add(init_folder(arm, seed, root))
    keep |= {run_folder(root, name, first_seed) for name in timed}
    bases, seeds = set(parents_unresolved), set(seeds)
    if bases:
        for folder in (root / "runs").glob("*/seed*"):
            seed = folder.name[4:]
            if base_name(folder.parent.name) in bases and seed.isdigit() and int(seed) in seeds:
                keep.add(folder)
    return keep


def _members(root: Path, keep: Set[Path]) -> List[Path]:
    files: List[Path] = [root / "runs" / f for f in (DESIGN, REPLAN)  # the design, and its re-plan after the sweep
                         if (root / "runs" / f).is_file()]
    for folder in sorted((root / "runs").glob("*/seed*")):
        if not folder.is_dir():
            continue
        prepared = folder.name.endswith("-init")
        unmeasured = not prepared and not (folder / MEASURES).is_file()  # still training, or not yet measured
        weights = folder in keep or unmeasured
        if prepared and not weights:
            continue  # starting weights of runs that are finished: nothing reads them again
        for f in sorted(folder.rglob("*")):
            if f.is_symlink() or not f.is_file() or f.name.startswith("."):  # no links, no temporary files
                continue
            rel = f.relative_to(folder)
            if f.suffix in DRAWN or (rel.parts[0] == "checkpoints" and not unmeasured) or \
                    (f.suffix in WEIGHT_SUFFIXES and not weights):
                continue
            files.append(f)
    return files


def save_state(root: PathLike, path: PathLike, keep: Set[Path]) -> Dict[str, int]:
    """Write the archive of ``root``'s runs to ``path`` (atomically); returns what it holds."""
    root = Path(root)
    files = _members(root, {Path(k) for k in keep})
    weights = 0
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                info = tarfile.TarInfo(f.relative_to(root).as_posix())
                info.size, info.mode, info.mtime = f.stat().st_size, 0o644, 0
                weights += f.suffix in WEIGHT_SUFFIXES
                with open(f, "rb") as src:
                    tar.addfile(info, src)
    runs = {f.parent for f in files if f.name == "results.json"}
    return {"files": len(files), "finished_runs": len(runs), "weight_files": weights,
            "bytes": Path(path).stat().st_size}


def load_state(path: PathLike, root: PathLike) -> Dict[str, object]:
    """Restore the archive's runs into ``root``: every file ``root`` lacks (a file already there wins: the
    folder may be further on). Refuses, before writing anything, an archive that is not one, or holds a link,
    a path outside ``runs/`` or more than it should unpack to. Returns the counts and the code versions of the
    archive's runs as they now stand in ``root``."""
    path, root = Path(path), Path(root)
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            _check(path, members)
            restored = skipped = 0
            codes = set()
            for m in members:
                if m.isdir():
                    continue
                dest = root.joinpath(*PurePosixPath(m.name).parts)
                if dest.exists():
                    skipped += 1
                else:
                    with atomic_path(dest) as tmp, open(tmp, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(m), out)
                    restored += 1
                if dest.name == PROVENANCE:  # the code version of the run as it is now in root
                    codes.add(code_id(run_code(json.loads(dest.read_text()))))
            codes = sorted(codes)
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeDecodeError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a readable campaign state ({type(err).__name__}: {err})") from None
    return {"restored": restored, "already_here": skipped, "code_versions": codes}


def _check(path: Path, members: List[tarfile.TarInfo]) -> None:
    total = 0
    for m in members:
        parts = PurePosixPath(m.name).parts
        if not (m.isfile() or m.isdir()):
            raise DataError(f"{path}: {m.name!r} is a link or a device, which a campaign state never holds")
        if m.name.startswith("/") or ".." in parts or not parts or parts[0] != "runs" or "\\" in m.name:
            raise DataError(f"{path}: {m.name!r} lies outside the runs/ folder of a campaign state")
        total += m.size
    if total > MAX_BYTES:
        raise DataError(f"{path}: would unpack to {total / 2**30:.1f} GiB, more than a campaign state holds "
                        f"({MAX_BYTES / 2**30:.0f} GiB)")
