"""``vitkit reproduce``: the paper's claims tested at laptop scale, one command, one report.

Each claim (:mod:`.catalog`, types in :mod:`.claims`) is a set of arms; each arm is an ordinary run folder
of the training engine per seed (:mod:`.runs`), reused when finished and resumed when interrupted, so the
command can be stopped and started again across days. :mod:`.sweep` chooses learning rates on validation,
:mod:`.runner` schedules the runs, :mod:`.measure` measures them, :mod:`.stats` holds the verdict rule and
:mod:`.report` writes report.md, one PNG per claim and report.json (every value per seed).
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import ConfigError, MissingDependency
from ..utils import PathLike
from .budget import BUDGETS, Budget, get_budget, validation_overrides
from .catalog import arms_table, claims_table
from .claims import Arm, Claim, selector_arms

__all__ = ["reproduce", "plan", "Budget", "BUDGETS", "get_budget", "validation_overrides", "Arm", "Claim",
           "arms_table", "claims_table", "require_extra"]

EXTRA = ("scipy", "matplotlib")  # what the command imports beyond the core: the `reproduce` extra


def require_extra() -> None:
    """Fail before any training when the ``reproduce`` extra is not installed (one line naming it)."""
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(f"vitkit reproduce needs {' and '.join(missing)}, which "
                                f"{'is' if len(missing) == 1 else 'are'} not installed", extra="reproduce")


def needed_arms(claims: Sequence[Claim], arms: Dict[str, Arm]) -> List[str]:
    """Arm names the claims need (a selector needs its whole group), parents first, each once."""
    out: List[str] = []

    def add(name: str) -> None:
        if name in out:
            return
        if arms[name].parent:
            add(arms[name].parent)
        out.append(name)

    for c in claims:
        for t in c.tests:
            for n, _ in t.weights:
                for m in selector_arms(n, arms):
                    add(m)
        for n in c.arms:
            add(n)
    return out


def plan(claim_ids: Optional[Sequence[int]], budget: Budget):
    """(claims asked for, the arm table, arm names to train in order)."""
    claims = claims_table(budget.data_sizes)
    arms = arms_table(budget.data_sizes)
    ids = list(claim_ids) if claim_ids else sorted(claims)
    unknown = [i for i in ids if i not in claims]
    if unknown:
        raise ConfigError(f"unknown claim(s) {unknown}: the claims are {', '.join(map(str, sorted(claims)))}")
    chosen = [claims[i] for i in sorted(set(ids))]
    return chosen, arms, needed_arms(chosen, arms)


def reproduce(out: PathLike, claim_ids: Optional[Sequence[int]] = None, budget: Any = "quick", *,
              command: str = "", progress: bool = False, report_only: bool = False, jobs: int = 1,
              allow_mixed_code: bool = False, allow_missing_seeds: bool = False,
              log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Sweep the learning rates, train (or reuse) every arm the claims need, measure them, and write
    OUT/report.md, OUT/claimN.png and OUT/report.json. Returns the report dict. ``report_only``: use the
    finished runs on disk, train nothing. ``jobs``: runs trained at once, each in its own process.
    ``allow_mixed_code`` / ``allow_missing_seeds``: compare runs of different code versions / with seeds
    missing (said in the report) instead of refusing."""
    from ..bench.machine import machine_line
    from . import report as rep
    from . import sweep
    from .claims import SPEED
    from .measure import paired_speed
    from .runner import collected, run_all
    from .runs import run_folder

    require_extra()
    budget = get_budget(budget) if isinstance(budget, str) else budget
    claims, arms, names = plan(claim_ids, budget)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0, done = time.perf_counter(), {}

    def train(run_names, table, seeds, known=None):
        if report_only:
            return collected(run_names, seeds, out)
        return run_all(run_names, table, budget, out, progress=progress and jobs == 1, log=log, stats=done,
                       jobs=jobs, seeds=seeds, known=known)

    fams = sweep.families(names, arms)
    points = sweep.sweep_arms(fams, arms, budget)
    log(f"budget {budget.name}: learning-rate sweep of {len(fams)} families ({len(points)} runs x "
        f"{len(budget.sweep_seeds)} seeds)")
    swept = train(list(points), points, budget.sweep_seeds)
    chosen = sweep.choose(fams, arms, budget, {n: [m.get("val_top1") for m in ms] for n, ms in swept.items()})
    runs, alias = sweep.resolve(arms, chosen)
    run_names = list(dict.fromkeys(alias[n] for n in names))
    log(f"{len(run_names)} runs x {len(budget.seeds)} seeds under {out / 'runs'}")
    measures = train(run_names, runs, budget.seeds, swept)
    timed = sorted({alias[a] for c in claims if any(t.metric == SPEED for t in c.tests) for a in c.arms})
    speeds = {}
    if timed and all(len(measures.get(a, [])) == len(budget.seeds) for a in timed):
        log(f"timing {', '.join(timed)} side by side")
        speeds = paired_speed({a: run_folder(out, a, budget.seeds[0]) for a in timed})
    report = rep.build(claims, arms, alias, measures, budget, command=command, machine=machine_line(),
                       speeds=speeds, sweeps=chosen, allow_mixed_code=allow_mixed_code,
                       allow_missing_seeds=allow_missing_seeds)
    report["compute"] = rep.compute({**swept, **measures}, wall_s=time.perf_counter() - t0, runs=done, jobs=jobs)
    path = rep.write(report, out, claims)
    log(f"report: {path}")
    return report
