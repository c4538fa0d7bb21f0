"""``vitkit reproduce``: the paper's claims tested at laptop scale, one command, one report.

Each claim (:mod:`.claims`) is a set of arms; each arm is an ordinary run folder of the training engine per
seed (:mod:`.runner`), reused when finished and resumed when interrupted, so the command can be stopped and
started again across days. :mod:`.stats` holds the verdict rule; :mod:`.report` writes report.md, one PNG
per claim and report.json.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from ..utils import PathLike
from .budget import BUDGETS, Budget, get_budget, validation_overrides
from .claims import Arm, Claim, arms_table, claims_table

__all__ = ["reproduce", "plan", "Budget", "BUDGETS", "get_budget", "validation_overrides", "Arm", "Claim",
           "arms_table", "claims_table"]


def plan(claim_ids: Optional[Sequence[int]], budget: Budget):
    """(claims asked for, the arm table, canonical run names to train in order)."""
    from .runner import needed_arms

    claims = claims_table(budget.data_sizes)
    arms = arms_table(budget.data_sizes)
    ids = list(claim_ids) if claim_ids else sorted(claims)
    unknown = [i for i in ids if i not in claims]
    if unknown:
        raise ValueError(f"unknown claim(s) {unknown}: the claims are {', '.join(map(str, sorted(claims)))}")
    chosen = [claims[i] for i in sorted(set(ids))]
    return chosen, arms, needed_arms(chosen, arms, claims)


def reproduce(out: PathLike, claim_ids: Optional[Sequence[int]] = None, budget: Any = "quick", *,
              command: str = "", progress: bool = False, report_only: bool = False, jobs: int = 1,
              log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Train (or reuse) every arm the claims need, measure them, and write OUT/report.md, OUT/claimN.png and
    OUT/report.json. Returns the report dict. ``report_only``: use the finished runs on disk, train nothing.
    ``jobs``: runs trained at once, each in a worker process with its share of the cores."""
    from ..bench.machine import machine_line
    from . import report as rep
    from .claims import SPEED
    from .runner import canonical, collected, paired_speed, run_all

    budget = get_budget(budget) if isinstance(budget, str) else budget
    claims, arms, names = plan(claim_ids, budget)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"budget {budget.name}: {len(names)} arms x {len(budget.seeds)} seeds = {len(names) * len(budget.seeds)} "
        f"runs under {out / 'runs'}")
    t0 = time.perf_counter()
    done: Dict[str, int] = {}
    measures = collected(names, budget, out) if report_only else run_all(names, arms, budget, out,
                                                                           progress=progress and jobs == 1, log=log,
                                                                           stats=done, jobs=jobs)
    canon = {n: canonical(n, arms) for n in arms}
    # every arm of a claim that compares speeds, timed side by side in this process
    timed = sorted({a for c in claims if any(t.metric == SPEED for t in c.tests) for a in c.arms})
    speeds = {}
    if timed and all(len(measures.get(canonical(a, arms), [])) == len(budget.seeds) for a in timed):
        log(f"timing {', '.join(timed)} side by side")
        by_run = paired_speed([canonical(a, arms) for a in timed], arms, budget, out)
        speeds = {a: by_run[canonical(a, arms)] for a in timed}
    report = rep.build(claims, arms, measures, canon, budget, command=command, machine=machine_line(),
                       all_names=names, speeds=speeds)
    report["compute"] = rep.compute(measures, wall_s=time.perf_counter() - t0, runs=done, jobs=jobs)
    path = rep.write(report, out, claims)
    log(f"report: {path}")
    return report
