"""The seeds planned again once the sweep has chosen: the design (:mod:`.campaign`) priced every arm at the
budget's schedule, before the sweep could say how long each arm must train to converge. Once the sweep has
fixed every arm's rate and schedule, and before any seed beyond the sweep's trains, :func:`replan` runs the
same planner (:func:`vitkit.reproduce.campaign.plan_seeds`) again over the claims the design found testable:
the same planning SDs (the v2 prior pooled with the pilot, at their upper confidence limit), the arms priced at
the schedules the sweep chose, and the design's hours less what the sweep spent on points no arm reuses. A
claim whose seeds no longer fit is declared not testable there, before its seeded arms train; the compute of
the others follows the planner's rule (lowest power first).

The re-plan is written once to OUT/runs/replan.json (it travels with the campaign state and is reused when
the campaign resumes) and kept in the report as ``design["replan"]``: per claim its seeds, power and minimum
detectable effect before and after.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..utils import write_json_atomic
from .budget import Budget
from .claims import Arm, Claim
from .rule import claim_arms
from .runs import REPLAN

KEPT = ("testable", "seeds", "power", "mde", "level", "reason")


def replan(plan: Mapping[str, Any], design: Mapping[str, Any], claims: Sequence[Claim], arms: Mapping[str, Arm],
           runs: Mapping[str, Arm], alias: Mapping[str, str], swept: Mapping[str, Arm], budget: Budget
           ) -> Dict[str, Any]:
    """The design's planner run again at the schedules the sweep chose (``runs``/``alias``:
    :func:`vitkit.reproduce.sweep.resolve`; ``swept``: every sweep point trained, run name -> arm).
    Returns {"claims": {claim: {"before": ..., "after": ...}}, "arms": {run: seeds}, "budget_s", "cost_s",
    "sweep_s", "wall_hours", "level"}."""
    from .campaign import arm_costs, plan_seeds

    if budget.hours is None:
        raise ConfigError(f"budget {budget.name} states no hours to plan within")
    rate, over = float(design["seconds_per_gmac"]) / 1e9, float(design["overhead_s_per_run"])
    jobs = max(1, int(design.get("jobs") or 1))
    on = [c for c in claims if (design["claims"].get(str(c.id)) or {}).get("testable")]
    of = {c.id: list(dict.fromkeys(alias[a] for a in claim_arms(c, arms))) for c in on}
    every = list(dict.fromkeys(r for v in of.values() for r in v))
    cost = arm_costs(every, runs, budget, rate, over)
    # the sweep's points are paid; those that are main runs count again in the plan's cost, so they are credited
    point = arm_costs(list(swept), swept, budget, rate, over)
    k = len(budget.sweep_seeds)
    spent = k * sum(point.values())
    credit = k * sum(cost[r] for r in every if r in swept)
    budget_s = budget.hours * 3600 * jobs - spent + credit
    prim = {c.id: design["claims"][str(c.id)] for c in on}
    got = plan_seeds(prim, {c: prim[c].get("sd_plan") for c in prim}, of, cost, budget_s,
                     alpha=float(plan["alpha"]), target=float(plan["power"]), lo=int(plan["seeds"]["min"]),
                     hi=int(plan["seeds"]["max"]))
    per = {str(c): {"before": {k2: prim[c].get(k2) for k2 in KEPT},
                    "after": {k2: rec.get(k2) for k2 in KEPT}} for c, rec in got["claims"].items()}
    for rec in per.values():
        if not rec["after"]["testable"]:
            rec["after"]["reason"] = "after the sweep: " + str(rec["after"]["reason"])
    return {"plan": plan["sha256"], "claims": per, "arms": got["arms"], "budget_s": budget_s,
            "cost_s": got["cost_s"], "sweep_s": spent, "level": got["level"], "jobs": jobs,
            "wall_hours": (got["cost_s"] + spent - credit) / 3600 / jobs}


def replanned_design(design: Mapping[str, Any], rec: Mapping[str, Any]) -> Dict[str, Any]:
    """The design as the report reads it after the re-plan: each claim's seeds, power, MDE and testability
    the re-plan's (the design made before training kept under ``before_sweep``), and ``replan`` the record."""
    claims = {c: {**r, **rec["claims"][c]["after"], "before_sweep": rec["claims"][c]["before"]}
              if c in rec["claims"] else dict(r) for c, r in design["claims"].items()}
    return {**design, "claims": claims, "arms_before_sweep": design.get("arms"), "arms": rec["arms"],
            "replan": dict(rec)}


def replan_lines(rec: Mapping[str, Any]) -> List[str]:
    """One line per claim: its seeds, power and MDE before and after the re-plan."""
    from .campaign import amount

    def one(r: Mapping[str, Any], c: int) -> str:
        mde = "-" if r.get("mde") is None else amount(r["mde"], c)
        if not r.get("testable"):
            return f"not testable ({r.get('reason')}), MDE {mde}"
        return f"{r['seeds']} seeds, power {r['power']:.0%}, MDE {mde}"
    return [f"claim {c:>2}: {one(r['before'], int(c))} -> {one(r['after'], int(c))}"
            for c, r in rec["claims"].items()]


def after_sweep(plan: Mapping[str, Any], design: Mapping[str, Any], claims: Sequence[Claim],
                arms: Mapping[str, Arm], names: Sequence[str], resolved: Tuple[Dict[str, Arm], Dict[str, str]],
                swept: Mapping[str, Arm], budget: Budget, out: Path, log: Callable[[str], None]
                ) -> Tuple[List[str], Dict[str, Any], Dict[str, List[int]]]:
    """(arm names still to train, the design as re-planned, seeds per arm): OUT/runs/replan.json when the
    campaign has one (made under this plan), else the re-plan written there; said in the log."""
    runs, alias = resolved
    path = out / "runs" / REPLAN
    rec: Optional[Dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else None
    if rec is not None and rec.get("plan") != plan["sha256"]:
        raise ConfigError(f"{path} was made under another analysis plan: start a new campaign in another --out")
    if rec is None:
        rec = replan(plan, design, claims, arms, runs, alias, swept, budget)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, rec)
    log(f"the seeds planned again at the rates and schedules the sweep chose ({path}; about "
        f"{rec['wall_hours']:.1f} h wall at --jobs {rec['jobs']} in all):")
    for line in replan_lines(rec):
        log("  " + line)
    got = replanned_design(design, rec)
    wanted = {a for c in claims if (got["claims"].get(str(c.id)) or {}).get("testable") for a in claim_arms(c, arms)}
    kept = [n for n in names if n in wanted]
    return kept, got, {n: list(range(max(len(budget.seeds), int(rec["arms"].get(alias[n], 0))))) for n in kept}
