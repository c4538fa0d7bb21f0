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

import json
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Set

from ..archive import DRAWN, WEIGHT_SUFFIXES, read_archive, write_archive
from ..errors import DataError
from ..utils import PathLike
from .claims import Arm
from .measure import MEASURES, PROVENANCE, code_id, run_code
from .runs import DESIGN, REPLAN, init_folder, run_folder


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
    size = write_archive(path, [(f.relative_to(root).as_posix(), f) for f in files])
    runs = {f.parent for f in files if f.name == "results.json"}
    return {"files": len(files), "finished_runs": len(runs),
            "weight_files": sum(f.suffix in WEIGHT_SUFFIXES for f in files), "bytes": size}


def load_state(path: PathLike, root: PathLike) -> Dict[str, object]:
    """Restore the archive's runs into ``root``: every file ``root`` lacks (a file already there wins: the
    folder may be further on). Refuses, before writing anything, an archive that is not one, or holds a link,
    a path outside ``runs/`` or more than it should unpack to. Returns the counts and the code versions of the
    archive's runs as they now stand in ``root``."""
    restored, files = read_archive(path, Path(root) / "runs", "runs", what="campaign state")
    try:
        codes = sorted({code_id(run_code(json.loads(f.read_text()))) for f in files if f.name == PROVENANCE})
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable campaign state ({type(err).__name__}: {err})") from None
    return {"restored": restored, "already_here": len(files) - restored, "code_versions": codes}
