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
              allow_mixed_code: bool = False, allow_missing_seeds: bool = False, state: Optional[PathLike] = None,
              log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Sweep the learning rates, train (or reuse) every arm the claims need, measure them, and write
    OUT/report.md, OUT/claimN.png and OUT/report.json. Returns the report dict. ``report_only``: use the
    finished runs on disk, train nothing. ``jobs``: runs trained at once, each in its own process.
    ``allow_mixed_code`` / ``allow_missing_seeds``: compare runs of different code versions / with seeds
    missing (said in the report) instead of refusing. ``state``: the campaign's portable state (:mod:`.state`):
    the runs it holds that OUT lacks are restored first, and it is rewritten after every finished run."""
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
    fams = sweep.families(names, arms)
    points = sweep.sweep_arms(fams, arms, budget)
    timed_arms = sorted({a for c in claims if any(t.metric == SPEED for t in c.tests) for a in c.arms})
    keeper = _Keeper(out, state, budget, arms, points, timed_arms, log)

    def train(run_names, table, seeds, known=None):
        if report_only:
            return collected(run_names, seeds, out)
        try:
            return run_all(run_names, table, budget, out, progress=progress and jobs == 1, log=log, stats=done,
                           jobs=jobs, seeds=seeds, known=known, after=keeper.save)
        finally:
            keeper.save()

    log(f"budget {budget.name}: learning-rate sweep of {len(fams)} families ({len(points)} runs x "
        f"{len(budget.sweep_seeds)} seeds)")
    swept = train(list(points), points, budget.sweep_seeds)
    chosen = sweep.choose(fams, arms, budget, {n: [m.get("val_top1") for m in ms] for n, ms in swept.items()})
    runs, alias = sweep.resolve(arms, chosen)
    run_names = list(dict.fromkeys(alias[n] for n in names))
    keeper.resolved(run_names, runs, alias)
    log(f"{len(run_names)} runs x {len(budget.seeds)} seeds under {out / 'runs'}")
    measures = train(run_names, runs, budget.seeds, swept)
    timed = sorted({alias[a] for a in timed_arms})
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


class _Keeper:
    """Restores the campaign state (``state``) into OUT at the start and rewrites it after every finished run:
    before the rates are chosen every run of a parent arm or of a timed arm's family keeps its weights (their
    runs' names are not known yet); after, exactly the parents of the runs still to come and the timed runs."""

    def __init__(self, out: Path, state: Optional[PathLike], budget: Budget, arms: Dict[str, Arm],
                 points: Dict[str, Arm], timed_arms: Sequence[str], log: Callable[[str], None]):
        self.out, self.state, self.budget, self.timed_arms = out, state, budget, list(timed_arms)
        self.table, self.pairs = dict(points), [(n, s) for n in points for s in budget.sweep_seeds]
        self.timed: List[str] = []
        self.unresolved = sorted({a.parent for a in arms.values() if a.parent} |
                                 {arms[a].family for a in timed_arms})
        if state is not None and Path(state).is_file():
            from .measure import code_id, code_version
            from .state import load_state
            got = load_state(state, out)
            here = code_id(code_version())
            log(f"campaign state {state}: {got['restored']} files restored, {got['already_here']} already in {out}")
            if any(c != here for c in got["code_versions"]):
                log(f"  its runs were trained by {', '.join(got['code_versions'])}; this code is {here}: "
                    f"run the campaign's own version, or the report will refuse to mix them")

    def resolved(self, run_names: Sequence[str], runs: Dict[str, Arm], alias: Dict[str, str]) -> None:
        self.table.update(runs)
        self.pairs = [(n, s) for n in run_names for s in self.budget.seeds]
        self.timed, self.unresolved = sorted({alias[a] for a in self.timed_arms}), []

    def save(self, *_: Any) -> None:
        if self.state is None:
            return
        from .state import save_state, weights_to_keep
        keep = weights_to_keep(self.out, self.pairs, self.table, timed=self.timed, first_seed=self.budget.seeds[0],
                               parents_unresolved=self.unresolved,
                               seeds=set(self.budget.seeds) | set(self.budget.sweep_seeds))
        save_state(self.out, self.state, keep)
