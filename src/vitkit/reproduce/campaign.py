"""The v3 campaign's design, decided before training: which arms the pilot trains (those of the primary
hypotheses) and what each primary can show at its seeds (its minimum detectable effect); from the spreads of
the committed v2 campaign (the plan's ``prior``) and the pilot, the seeds per arm of the full budget
(:func:`plan_seeds`) with the claims it cannot test and why, their arms left untrained. The design is written
to OUT/runs/design.json before the first run of the full budget, travels with the campaign state and is
reused when the campaign resumes. After the pilot: each primary's spread and the seeds the full budget needs.

The planner tests the primaries at the Bonferroni level alpha / m, m the number of testable primaries (Holm,
which the report uses, rejects whenever Bonferroni does, so the planned power is a lower bound); it plans with
an upper confidence limit of each SD (a pilot of few seeds under-estimates spread as often as not, Browne
1995), picks the seeds per claim within [lo, hi], declares a claim *not testable at this budget* when it needs
more than ``hi`` seeds or its arms do not fit, and gives the compute thus freed to the testable claims, lowest
power first.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..utils import PathLike, write_json_atomic
from . import stats as P
from .budget import Budget, get_budget
from .claims import Arm, Claim
from .rule import claim_arms, planning_sds, prior_spreads, report_spreads
from .runs import DESIGN

RATE_REFERENCE = "docs/reproduction/quick-amd-avx2/report.json"  # the slowest kind measured (AMD EPYC, AVX2)


def preview(plan: Mapping[str, Any], n: int, claims: Sequence[Claim]) -> Dict[int, Dict[str, Any]]:
    """What each primary can show with ``n`` seeds, at the Bonferroni level over the claims asked for, with
    the plan's prior spread (the v2 campaign's SD, not its upper limit): its MDE and its power for the effect of
    interest."""
    level = float(plan["alpha"]) / max(1, len(claims))
    out: Dict[int, Dict[str, Any]] = {}
    for c in claims:
        p, prior = plan["primary"][c.id], (plan.get("prior") or {}).get(str(c.id)) or {}
        sd = prior.get("sd")
        out[c.id] = {"n": n, "level": level, "sd": sd, "effect": p["effect"], "expect": p["expect"],
                     "mde": None if sd is None else P.mde(sd, n, level, p["expect"], float(plan["power"])),
                     "power": None if sd is None else P.power(float(p["effect"]), sd, n, level, p["expect"])}
    return out


def arm_costs(names: Sequence[str], arms: Mapping[str, Arm], budget: Budget, rate: float, overhead: float
              ) -> Dict[str, float]:
    """Seconds per seed of each arm under ``budget`` (estimate's model: multiply-adds x images, plus overhead)."""
    from .estimate import arm_macs, passes

    out = {}
    for n in names:
        a = arms[n] if arms[n].lr is not None or not budget.lr_sweep else arms[n].at_lr(budget.lr_sweep[0])
        seen, evals = passes(a, budget)
        out[n] = rate * arm_macs(a) * (3 * seen + evals) + overhead
    return out


def sweep_cost(names: Sequence[str], arms: Mapping[str, Arm], budget: Budget, rate: float, overhead: float) -> float:
    """Seconds of the sweep's runs that no arm reuses (every rate of its starting grid but the chosen one, at
    the sweep seeds). A grid grown past an end, or a schedule doubled to converge, costs more: the design
    cannot know it before the sweep has run, and says so (``sweep_note``)."""
    from .sweep import families, rates

    fams = families(list(names), arms)
    per = arm_costs(fams, arms, budget, rate, overhead)
    return sum(per[f] * (len(rates(arms[f], budget)) - 1) for f in fams) * len(budget.sweep_seeds)


def make_design(plan: Mapping[str, Any], claims: Sequence[Claim], arms: Mapping[str, Arm], budget: Budget,
                sds: Mapping[int, Mapping[str, Any]], rate: float, overhead: float, jobs: int = 2) -> Dict[str, Any]:
    """The full budget's design: seeds per claim and arm for 80% power (the plan's) at the planning SDs
    (``sds``: :func:`vitkit.reproduce.rule.planning_sds`), within ``budget.hours`` of wall time at ``jobs``
    runs at once, the sweep paid first."""
    if budget.hours is None:
        raise ConfigError(f"budget {budget.name} states no hours to plan within")
    of = {c.id: claim_arms(c, arms) for c in claims}
    every = list(dict.fromkeys(a for v in of.values() for a in v))
    cost = arm_costs(every, arms, budget, rate, overhead)
    # every arm of a claim runs at least the sweep seeds inside the sweep; only the seeds beyond them cost here
    swept = sweep_cost(every, arms, budget, rate, overhead)
    budget_s = budget.hours * 3600 * jobs - swept
    prim = {c.id: plan["primary"][c.id] for c in claims}
    got = plan_seeds(prim, {c: (sds.get(c) or {}).get("sd_plan") for c in prim}, of, cost, budget_s,
                   alpha=float(plan["alpha"]), target=float(plan["power"]), lo=int(plan["seeds"]["min"]),
                   hi=int(plan["seeds"]["max"]))
    got["claims"] = {str(c): {**rec, "sd": (sds.get(c) or {}).get("sd"), "df": (sds.get(c) or {}).get("df"),
                              "sd_plan": (sds.get(c) or {}).get("sd_plan"), "effect": prim[c]["effect"],
                              "expect": prim[c]["expect"]} for c, rec in got["claims"].items()}
    got.update({"plan": plan["sha256"], "budget": budget.name, "hours": budget.hours, "jobs": jobs,
                "sweep_s": swept, "seconds_per_gmac": rate * 1e9, "overhead_s_per_run": overhead,
                "wall_hours": (got["cost_s"] + swept) / 3600 / jobs,
                "sweep_note": "the sweep at its starting grids and schedules; each grid extension adds one rate "
                              "of its family at the sweep seeds, each doubling of a schedule its whole grid at "
                              "twice the length"})
    return got


def priced_after_sweep(design: Mapping[str, Any], runs: Mapping[str, Arm], seeds: Mapping[str, Sequence[int]],
                       budget: Budget) -> Dict[str, float]:
    """The design's main runs priced again once the sweep has fixed each family's rate and schedule (a doubled
    schedule doubles its arm's cost): planned and now, in wall hours at the design's jobs. The seeds do not
    change: they were fixed before training, for power; the hours say what the schedules cost."""
    rate, over = float(design["seconds_per_gmac"]) / 1e9, float(design["overhead_s_per_run"])
    cost = arm_costs(list(seeds), runs, budget, rate, over)
    jobs = max(1, int(design.get("jobs") or 1))
    return {"planned_h": float(design["cost_s"]) / 3600 / jobs,
            "now_h": sum(len(seeds[r]) * cost[r] for r in seeds) / 3600 / jobs}


def fitted_rate(pilot_report: Optional[Mapping[str, Any]], root: Optional[PathLike] = None) -> Dict[str, Any]:
    """(seconds per MAC, overhead per run, where from): fitted to the pilot when it was one complete
    invocation, else to the committed reference run (when the checkout has it)."""
    from .estimate import fit, rates

    if pilot_report is not None and (pilot_report.get("compute") or {}).get("complete"):
        rate, over = fit(dict(pilot_report), "the pilot")
        return {"rate": rate, "overhead": over, "source": "fitted to the pilot's own runs"}
    ref = Path(root or ".") / RATE_REFERENCE
    if not ref.is_file():
        raise ConfigError(f"no complete pilot run to fit this machine's speed to, and no {RATE_REFERENCE}: run the "
                          f"pilot (--budget quick) in one invocation first")
    rate, over = rates(ref)
    return {"rate": rate, "overhead": over, "source": f"fitted to {RATE_REFERENCE}"}


def load_or_make(out: Path, make: Callable[[], Dict[str, Any]], plan_sha: str) -> Dict[str, Any]:
    """OUT/runs/design.json when the campaign has one (made under this plan), else ``make()`` written there."""
    path = out / "runs" / DESIGN
    if path.is_file():
        got = json.loads(path.read_text())
        if got.get("plan") != plan_sha:
            raise ConfigError(f"{path} was made under another analysis plan: start a new campaign in another --out")
        return got
    got = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, got)
    return got


def design_lines(design: Mapping[str, Any]) -> List[str]:
    """One line per claim: testable with its seeds, power and MDE, or not testable with why and its MDE."""
    lines = []
    for c, r in design["claims"].items():
        mde = "-" if r.get("mde") is None else amount(r["mde"], int(c))
        eff = amount(r["effect"], int(c))
        if r["testable"]:
            lines.append(f"claim {c:>2}: {r['seeds']} seeds, power {r['power']:.0%} for {eff}, MDE {mde}")
        else:
            lines.append(f"claim {c:>2}: not testable at this budget ({r['reason']}); MDE {mde} at "
                         f"{r.get('seeds', '-')} seeds, against an effect of interest of {eff}")
    return lines


def amount(x: float, claim: int) -> str:
    """An effect in its unit: accuracy in points; claim 9's distance ratio and claim 10's slope as numbers."""
    return f"{x:.3g}" if claim in (9, 10) else f"{100 * x:.2f} pt"


def seeds_by_arm(design: Mapping[str, Any], names: Sequence[str], minimum: Sequence[int]) -> Dict[str, List[int]]:
    """Seeds of each arm to train: the design's count (seeds 0..n-1), at least the budget's own seeds."""
    per = design.get("arms") or {}
    return {n: list(range(max(len(minimum), int(per.get(n, 0))))) for n in names}


def _cost(seeds: Mapping[int, int], arms_of: Mapping[int, Sequence[str]], cost: Mapping[str, float]) -> float:
    """Seconds of training when each claim c runs seeds[c] seeds of its arms (an arm shared by claims runs the
    most any of them asks for, once)."""
    per_arm: Dict[str, int] = {}
    for c, n in seeds.items():
        for a in arms_of[c]:
            per_arm[a] = max(per_arm.get(a, 0), n)
    return sum(n * cost[a] for a, n in per_arm.items())


def plan_seeds(primaries: Mapping[int, Mapping[str, object]], sds: Mapping[int, Optional[float]],
           arms_of: Mapping[int, Sequence[str]], cost: Mapping[str, float], budget_s: float, *, alpha: float = 0.05,
           target: float = 0.8, lo: int = 5, hi: int = 20) -> Dict[str, object]:
    """Seeds per claim for ``target`` power of each primary at level alpha / m, within ``budget_s`` seconds.

    m is the number of claims tested. A claim that cannot reach ``target`` with ``hi`` seeds leaves the family
    one at a time (the least powered first), and the rest are sized again at the level of the smaller family;
    then, while their seeds cost more than the budget, the claim whose arms free the most compute leaves, and
    the claims left out for power are tried again at the new level. A claim left out keeps the level it was
    judged at (its MDE and power are given at that level).

    ``primaries``: claim -> {"expect", "effect"}; ``sds``: claim -> planning SD of its per-seed value (None:
    unknown, not testable); ``arms_of``: claim -> the arms it trains; ``cost``: arm -> seconds per seed.
    Returns {"claims": {claim: {testable, seeds, power, mde, level, reason}}, "arms": {arm: seeds},
    "cost_s", "budget_s", "testable"}."""
    out: Dict[int, Dict[str, object]] = {}
    testable = [c for c in sorted(primaries) if sds.get(c) is not None]
    for c in sorted(set(primaries) - set(testable)):
        out[c] = {"testable": False, "reason": "no estimate of its spread (no pilot values)"}
    seeds: Dict[int, int] = {}
    short_of_power: List[int] = []  # left out for power at the family size of the time
    while True:
        level = alpha / max(1, len(testable))
        seeds, short = _seeds_at(testable, primaries, sds, level, target, lo, hi)
        if short:  # one at a time: the claim furthest from the target goes, the others are tried again at the
            # looser level of the smaller family (dropping all at once would drop claims that fit there)
            worst = min(short, key=lambda c: (P.power(float(primaries[c]["effect"]), float(sds[c]), hi, level,
                                                      str(primaries[c]["expect"])), -c))
            out[worst] = {"testable": False, "seeds": hi, "level": level,
                          "reason": f"needs more than {hi} seeds for {target:.0%} power at level "
                                    f"{alpha:g}/{len(testable)}, one of {len(testable)} primaries"}
            testable.remove(worst)
            short_of_power.append(worst)
            continue
        if _cost(seeds, arms_of, cost) <= budget_s or not testable:
            break
        # the claim whose arms cost the most beyond the others' goes, and its compute to the others
        saving = {c: _cost(seeds, arms_of, cost) - _cost({k: v for k, v in seeds.items() if k != c}, arms_of, cost)
                  for c in testable}
        worst = max(testable, key=lambda c: (saving[c], c))
        testable.remove(worst)
        out[worst] = {"testable": False, "seeds": seeds[worst], "level": level, "reason": f"its {seeds[worst]} "
                      f"seeds do not fit the budget ({saving[worst] / 3600:.1f} h beyond the other claims)"}
        # a smaller family has a looser level: the claims left out for power are tried again
        testable = sorted(testable + short_of_power)
        for c in short_of_power:
            del out[c]
        short_of_power = []
    level = alpha / max(1, len(testable))
    _spend_rest(seeds, primaries, sds, arms_of, cost, budget_s, level, hi)
    for c in testable:
        p = primaries[c]
        out[c] = {"testable": True, "seeds": seeds[c], "reason": "",
                  "power": P.power(float(p["effect"]), float(sds[c]), seeds[c], level, str(p["expect"]))}
    _mde_and_power(out, primaries, sds, level, target, hi)
    per_arm = {a: max(seeds[c] for c in testable if a in arms_of[c])
               for a in {a for c in testable for a in arms_of[c]}}
    return {"claims": dict(sorted(out.items())), "arms": dict(sorted(per_arm.items())),
            "cost_s": _cost(seeds, arms_of, cost), "budget_s": float(budget_s), "testable": sorted(testable),
            "level": level, "target": target}


def _seeds_at(testable: Sequence[int], primaries, sds, level: float, target: float, lo: int,
              hi: int) -> Tuple[Dict[int, int], List[int]]:
    """The seeds each claim needs for ``target`` power at ``level``, and the claims no count up to ``hi`` powers."""
    seeds: Dict[int, int] = {}
    short: List[int] = []
    for c in testable:
        p = primaries[c]
        n = P.seeds_for(float(p["effect"]), float(sds[c]), level, str(p["expect"]), target, lo, hi)
        if n is None:
            short.append(c)
        else:
            seeds[c] = n
    return seeds, short


def _mde_and_power(out: Dict[int, Dict[str, object]], primaries, sds, level: float, target: float,
                   hi: int) -> None:
    """Every claim's MDE at its seeds, and a left-out claim's power, at the level it was judged at."""
    for c, rec in out.items():
        rec.setdefault("level", level)
        if sds.get(c) is not None:
            n = int(rec.get("seeds") or hi)
            rec["mde"] = P.mde(float(sds[c]), n, rec["level"], str(primaries[c]["expect"]), target)
            if not rec["testable"]:
                rec["power"] = P.power(float(primaries[c]["effect"]), float(sds[c]), n, rec["level"],
                                     str(primaries[c]["expect"]))


def _spend_rest(seeds: Dict[int, int], primaries, sds, arms_of, cost, budget_s: float, level: float,
                hi: int) -> None:
    """The budget left after every testable claim has its seeds: one more seed at a time to the claim of lowest
    power whose extra seed still fits (in place)."""
    def pw(c: int, n: int) -> float:
        return P.power(float(primaries[c]["effect"]), float(sds[c]), n, level, str(primaries[c]["expect"]))
    while True:
        room: List[int] = [c for c in seeds if seeds[c] < hi and
                           _cost({**seeds, c: seeds[c] + 1}, arms_of, cost) <= budget_s]
        if not room:
            return
        c = min(room, key=lambda k: (pw(k, seeds[k]), k))
        seeds[c] += 1


ROOT = Path(__file__).resolve().parents[3]  # the checkout (for the committed rate reference)


def before_training(prereg: Dict[str, Any], claims: Sequence[Claim], arms: Dict[str, Arm], names: List[str],
                    budget: Budget, out: Path, pilot: Optional[PathLike], jobs: int, log: Callable[[str], None],
                    restore: Callable[[], None]) -> Tuple[List[str], Optional[Dict[str, Any]],
                                                          Optional[Dict[str, List[int]]]]:
    """(arm names to train, the design or None, seeds per arm or None), after saying what the budget can show."""
    restore()
    if budget.pilot:
        wanted = {a for c in claims for a in claim_arms(c, arms, prereg)}
        log(f"the pilot: what each primary hypothesis can show with {len(budget.seeds)} seeds (80% power, "
            f"Bonferroni over {len(claims)} claims, with the spread the v2 campaign measured):")
        for cid, r in preview(prereg, len(budget.seeds), claims).items():
            log(f"  claim {cid:>2}: {_mde_line(r, cid)}")
        return [n for n in names if n in wanted], None, None

    def make() -> Dict[str, Any]:
        report = json.loads(Path(pilot).read_text()) if pilot else None
        sources = [prior_spreads(prereg)] + ([report_spreads(report, prereg)] if report else [])
        rate = _rate(report)
        got = make_design(prereg, claims, arms, budget, planning_sds(sources, prereg), rate["rate"],
                          rate["overhead"], max(1, jobs))
        got.update({"rate_source": rate["source"], "pilot": str(pilot) if pilot else None,
                    "spread_sources": ["the plan's prior (v2)"] + (["the pilot"] if report else [])})
        return got
    design = load_or_make(out, make, prereg["sha256"])
    log(f"the design (made before training, {out / 'runs' / 'design.json'}): about {design['wall_hours']:.1f} h "
        f"wall at --jobs {design['jobs']} ({design['rate_source']})")
    for line in design_lines(design):
        log("  " + line)
    wanted = {a for c in claims if (design["claims"].get(str(c.id)) or {}).get("testable")
              for a in claim_arms(c, arms)}
    kept = [n for n in names if n in wanted]
    return kept, design, seeds_by_arm(design, kept, budget.seeds)


def _rate(report: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    try:
        return fitted_rate(report, ROOT)
    except ConfigError:
        if report is None:
            raise
        return fitted_rate(None, ROOT)  # a pilot of another budget (tests) or not one invocation


def _mde_line(r: Mapping[str, Any], cid: int) -> str:
    if r.get("mde") is None:
        return "no prior spread"
    return (f"MDE {amount(r['mde'], cid)} against an effect of interest of {amount(r['effect'], cid)} "
            f"(power {r['power']:.0%})")


def after_pilot(prereg: Dict[str, Any], report: Dict[str, Any], claims: Sequence[Claim], arms: Dict[str, Arm],
                out: Path, jobs: int, log: Callable[[str], None]) -> Dict[str, Any]:
    """Each primary's spread in the pilot, pooled with the plan's prior, and the full budget's design from them
    (what ``--budget full --pilot OUT/report.json`` will use)."""
    spreads = report_spreads(report, prereg)
    sds = planning_sds([prior_spreads(prereg), spreads], prereg)
    rate = _rate(report)
    full = get_budget("full").with_(plan_sha=prereg["sha256"])
    design = make_design(prereg, claims, arms, full, sds, rate["rate"], rate["overhead"], max(2, jobs))
    design["rate_source"] = rate["source"]
    log("the pilot's spreads (SD over seeds of each primary's per-seed value; pooled with the v2 prior; the "
        f"planner uses the {float(prereg['spread']['quantile']):.0%} upper confidence limit):")
    for cid, (sd, df) in sorted(spreads.items()):
        s = sds[cid]
        log(f"  claim {cid:>2}: pilot SD {amount(sd, cid) if sd is not None else '-'} (df {df}); pooled "
            f"{amount(s['sd'], cid) if s['sd'] is not None else '-'} (df {s['df']}); planning "
            f"{amount(s['sd_plan'], cid) if s['sd_plan'] is not None else '-'}")
    log(f"the full budget needs (about {design['wall_hours']:.1f} h wall at --jobs {design['jobs']}, "
        f"{rate['source']}):")
    for line in design_lines(design):
        log("  " + line)
    return {"spreads": {str(c): {"sd": sd, "df": df} for c, (sd, df) in spreads.items()},
            "planning": {str(c): v for c, v in sds.items()}, "design": design}
