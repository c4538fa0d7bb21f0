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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import MissingDependency
from ..utils import PathLike
from .budget import BUDGETS, Budget, get_budget, validation_overrides
from .catalog import arms_table, claims_table, needed_arms, plan
from .claims import Arm, Claim

__all__ = ["reproduce", "plan", "Budget", "BUDGETS", "get_budget", "validation_overrides", "Arm", "Claim",
           "arms_table", "claims_table", "needed_arms", "require_extra"]

EXTRA = ("scipy", "matplotlib")  # what the command imports beyond the core: the `reproduce` extra


def require_extra() -> None:
    """Fail before any training when the ``reproduce`` extra is not installed (one line naming it)."""
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(f"vitkit reproduce needs {' and '.join(missing)}, which "
                                f"{'is' if len(missing) == 1 else 'are'} not installed", extra="reproduce")


def reproduce(out: PathLike, claim_ids: Optional[Sequence[int]] = None, budget: Any = "quick", *,
              command: str = "", progress: bool = False, report_only: bool = False, jobs: int = 1,
              allow_mixed_code: bool = False, allow_missing_seeds: bool = False, state: Optional[PathLike] = None,
              plan_file: Optional[PathLike] = None, pilot: Optional[PathLike] = None,
              log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Sweep the learning rates, train (or reuse) every arm the claims need, measure them, and write
    OUT/report.md, OUT/claimN.png and OUT/report.json; returns the report. The options: see ``vitkit reproduce
    --help`` (``state``: :mod:`.state`). A v3 budget follows the analysis plan (``plan_file``, default the
    committed one) and decides before training what it can show (:mod:`.campaign`; ``pilot``: the pilot's
    report.json, whose spreads size the full budget's seeds)."""
    from ..bench.machine import machine_line
    from . import report as rep
    from . import sweep
    from .runner import collected, run_all

    require_extra()
    budget, prereg = _plan(get_budget(budget) if isinstance(budget, str) else budget, plan_file)
    claims, arms, names = plan(claim_ids, budget)
    (out := Path(out)).mkdir(parents=True, exist_ok=True)
    t0, done, design, seeds_of = time.perf_counter(), {}, None, None
    if prereg is not None:
        from .campaign import before_training
        names, design, seeds_of = before_training(prereg, claims, arms, names, budget, out, pilot, jobs, log,
                                                  restore=lambda: _Keeper.restore(out, state, log))
    fams = sweep.families(names, arms, fixed=prereg is not None)  # v3: fixed-rate arms grow their schedules too
    points = sweep.sweep_arms((sweep.stages(fams, arms) or [[]])[0], arms, budget)  # the first round's
    timed_arms = _timed_arms(claims, names)
    keeper = _Keeper(out, state, budget, arms, points, timed_arms, log, restored=prereg is not None)

    def train(run_names, table, seeds, known=None):
        keeper.add(run_names, table, seeds)
        if report_only:
            return collected(run_names, seeds, out)
        try:
            return run_all(run_names, table, budget, out, progress=progress and jobs == 1, log=log, stats=done,
                           jobs=jobs, seeds=seeds, known=known, after=keeper.save)
        finally:
            keeper.save()

    chosen, swept = _sweep(fams, arms, budget, train, prereg, log)
    runs, alias = sweep.resolve(arms, chosen)
    names, design, seeds_of = _replanned(prereg, design, seeds_of, report_only, claims, arms, names, (runs, alias),
                                         {r: keeper.table[r] for r in swept}, budget, out, log)
    run_names = list(dict.fromkeys(alias[n] for n in names))
    run_seeds = _run_seeds(run_names, alias, names, seeds_of, budget)
    keeper.resolved(run_names, runs, alias, run_seeds)
    design = _priced(design, runs, run_seeds, budget, log)
    log(f"{len(run_names)} runs x {len(budget.seeds)}{'+' if seeds_of else ''} seeds under {out / 'runs'}")
    measures = train(run_names, runs, run_seeds, swept)
    speeds = _speeds(timed_arms, alias, measures, budget, out, prereg, log, time_now=not report_only)
    report = rep.build(claims, arms, alias, measures, budget, command=command, machine=machine_line(),
                       speeds=speeds, sweeps=chosen, allow_mixed_code=allow_mixed_code,
                       allow_missing_seeds=allow_missing_seeds, plan=prereg, design=design,
                       expected={n: run_seeds[alias[n]] for n in names} if seeds_of else None)
    report["compute"] = rep.compute({**swept, **measures}, wall_s=time.perf_counter() - t0, runs=done, jobs=jobs)
    if prereg is not None and budget.pilot:
        from .campaign import after_pilot
        report["pilot"] = after_pilot(prereg, report, claims, arms, out, jobs, log)
    log(f"report: {rep.write(report, out, claims)}")
    return report


def _plan(budget: Budget, plan_file: Optional[PathLike]) -> Tuple[Budget, Optional[Dict[str, Any]]]:
    """(the budget with the plan's hash for its runs to record, the analysis plan a v3 budget follows; None
    for a v2 budget)."""
    if budget.version < 3:
        return budget, None
    from .rule import load_plan
    prereg = load_plan(plan_file)
    return budget.with_(plan_sha=prereg["sha256"]), prereg


def _replanned(prereg: Optional[Dict[str, Any]], design: Optional[Dict[str, Any]], seeds_of: Any, report_only: bool,
               claims: Sequence[Claim], arms: Dict[str, Arm], names: List[str], *rest: Any) -> Tuple[Any, Any, Any]:
    """(names, design, seeds per arm): under a design, the seeds planned again at the rates and schedules the
    sweep chose (:func:`.replan.after_sweep`; --report-only reads the campaign's re-plan, never makes one)."""
    out = rest[-2]
    if not design or (report_only and not (out / "runs" / "replan.json").is_file()):
        return names, design, seeds_of
    from .replan import after_sweep
    return after_sweep(prereg, design, claims, arms, names, *rest)


def _priced(design: Optional[Dict[str, Any]], runs: Dict[str, Arm], seeds: Any, budget: Budget,
            log: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """The design with its main runs priced again at the schedules the sweep chose (said, and kept in the
    report; the design file is not changed)."""
    if not design:
        return design
    from .campaign import priced_after_sweep
    got = {**design, "after_sweep": priced_after_sweep(design, runs, seeds, budget)}
    log("the main runs at the schedules the sweep chose: about {now_h:.1f} h wall (the design priced them at "
        "{planned_h:.1f} h)".format(**got["after_sweep"]))
    return got


def _sweep(fams: List[str], arms: Dict[str, Arm], budget: Budget, train: Callable[..., Dict[str, Any]],
           prereg: Optional[Dict[str, Any]], log: Callable[[str], None]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(each family's choice, the sweep's measures): under a plan the grown sweep (:func:`.sweep.grow`, the
    plan's convergence rule on the chosen point's curves); before plans (v2) one pass over the grid."""
    from . import sweep

    first = sweep.sweep_arms((sweep.stages(fams, arms) or [[]])[0], arms, budget)
    log(f"budget {budget.name}: learning-rate sweep of {len(fams)} families ({len(first)} runs x "
        f"{len(budget.sweep_seeds)} seeds{', grown until interior and converged' if prereg else ''})")

    if prereg is None:
        swept = train(list(sweep.sweep_arms(fams, arms, budget)), sweep.sweep_arms(fams, arms, budget),
                      budget.sweep_seeds)
        return sweep.choose(fams, arms, budget, {n: [m.get("val_top1") for m in ms] for n, ms in swept.items()}), \
            swept
    from .convergence import converged_runs
    from .estimate import VAL_IMAGES
    n_val = budget.val_size or VAL_IMAGES
    return sweep.grow(fams, arms, budget, train, lambda ms: converged_runs(ms, n_val, prereg))


def _timed_arms(claims: Sequence[Claim], names: Sequence[str]) -> List[str]:
    from .claims import SPEED

    return sorted({a for c in claims if any(t.metric == SPEED for t in c.tests) for a in c.arms if a in names})


def _run_seeds(run_names: Sequence[str], alias: Dict[str, str], names: Sequence[str],
               seeds_of: Optional[Dict[str, List[int]]], budget: Budget) -> Any:
    """The seeds of each run: the budget's, or per run the most any of its arms' design asks for."""
    if not seeds_of:
        return budget.seeds
    per: Dict[str, List[int]] = {}
    for n in names:
        r = alias[n]
        if len(seeds_of.get(n, budget.seeds)) > len(per.get(r, [])):
            per[r] = list(seeds_of.get(n, budget.seeds))
    return {r: per.get(r, list(budget.seeds)) for r in run_names}


def _speeds(timed_arms: Sequence[str], alias: Dict[str, str], measures: Dict[str, List[Dict[str, Any]]],
            budget: Budget, out: Path, prereg: Optional[Dict[str, Any]], log: Callable[[str], None],
            time_now: bool = True) -> Dict[str, List[float]]:
    """Claim 7's side-by-side speeds: under a plan, timed once in the campaign (the plan's rounds) and stored
    with the seed-0 runs, read back ever after (``time_now`` False, as with --report-only: never timed here,
    none when the campaign has not stored them); before plans (v2), timed when the report is written."""
    from .measure import paired_speed, stored_speed
    from .runs import run_folder

    timed = sorted({alias[a] for a in timed_arms})
    if not timed or not all(len(measures.get(a, [])) >= len(budget.seeds) for a in timed):
        return {}
    folders = {a: run_folder(out, a, budget.seeds[0]) for a in timed}
    if prereg is None:
        log(f"timing {', '.join(timed)} side by side")
        return paired_speed(folders)
    return stored_speed(folders, int(prereg["speed"]["rounds"]), log, time_now=time_now)


class _Keeper:
    """Restores the campaign state (``state``) into OUT at the start and rewrites it after every finished run:
    before the rates are chosen every run of a parent arm or of a timed arm's family keeps its weights (their
    runs' names are not known yet); after, exactly the parents of the runs still to come and the timed runs."""

    def __init__(self, out: Path, state: Optional[PathLike], budget: Budget, arms: Dict[str, Arm],
                 points: Dict[str, Arm], timed_arms: Sequence[str], log: Callable[[str], None],
                 restored: bool = False):
        self.out, self.state, self.budget, self.timed_arms = out, state, budget, list(timed_arms)
        self.table, self.pairs = dict(points), [(n, s) for n in points for s in budget.sweep_seeds]
        self.timed: List[str] = []
        self.unresolved = sorted({a.parent for a in arms.values() if a.parent} |
                                 {arms[a].family for a in timed_arms})
        if not restored:
            self.restore(out, state, log)

    @staticmethod
    def restore(out: Path, state: Optional[PathLike], log: Callable[[str], None]) -> None:
        """The runs (and the design) the state holds that OUT lacks, restored before anything trains."""
        if state is not None and Path(state).is_file():
            from .measure import code_id, code_version
            from .state import load_state
            got = load_state(state, out)
            here = code_id(code_version())
            log(f"campaign state {state}: {got['restored']} files restored, {got['already_here']} already in {out}")
            if any(c != here for c in got["code_versions"]):
                log(f"  its runs were trained by {', '.join(got['code_versions'])}; this code is {here}: "
                    f"run the campaign's own version, or the report will refuse to mix them")

    def add(self, run_names: Sequence[str], table: Dict[str, Arm], seeds: Any) -> None:
        """Runs about to train (the grown sweep's new points too): their checkpoints travel with the state."""
        self.table.update(table)
        have = set(self.pairs)
        self.pairs += [(n, s) for n in run_names for s in (seeds[n] if isinstance(seeds, dict) else seeds)
                       if (n, s) not in have]

    def resolved(self, run_names: Sequence[str], runs: Dict[str, Arm], alias: Dict[str, str], seeds: Any) -> None:
        self.table.update(runs)
        self.pairs = [(n, s) for n in run_names for s in (seeds[n] if isinstance(seeds, dict) else seeds)]
        self.timed, self.unresolved = sorted({alias[a] for a in self.timed_arms}), []

    def save(self, *_: Any) -> None:
        if self.state is None:
            return
        from .state import save_state, weights_to_keep
        keep = weights_to_keep(self.out, self.pairs, self.table, timed=self.timed, first_seed=self.budget.seeds[0],
                               parents_unresolved=self.unresolved,
                               seeds=set(self.budget.seeds) | set(self.budget.sweep_seeds) |
                               {s for _, s in self.pairs})
        save_state(self.out, self.state, keep)
