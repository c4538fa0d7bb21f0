"""The v3 arm checks: has an arm converged by the plan's rule on its validation curve, and did it run at a rate
inside its grid. An arm of a primary hypothesis that fails either cannot carry a verdict
(:func:`vitkit.reproduce.verdict.evaluate_v3` reads ``report["arm_checks"]``).

The rule (the plan's ``convergence``): the mean over seeds of the arm's validation curve (accuracy of the
raw weights at each of its evaluations); the arm has converged when the curve's last value exceeds the best
value before its last ``window`` evaluations by no more than ``z`` binomial standard errors of that accuracy
on the validation images, sqrt(p (1 - p) / n). Fewer than ``window + 1`` evaluations cannot show a plateau,
so such an arm has not converged.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

WINDOW, Z = 4, 2.0


def rule_of(plan: Optional[Mapping[str, Any]]) -> Dict[str, float]:
    conv = (plan or {}).get("convergence") or {}
    return {"window": int(conv.get("window", WINDOW)), "z": float(conv.get("z", Z))}


def mean_curve(curves: Sequence[Sequence[Sequence[float]]]) -> List[List[float]]:
    """The mean of per-seed curves ([point, accuracy] rows) over the evaluation points every seed has."""
    curves = [c for c in curves if c]
    if not curves:
        return []
    common = set.intersection(*[{float(p) for p, _ in c} for c in curves])
    return [[p, sum(dict((float(q), a) for q, a in c)[p] for c in curves) / len(curves)] for p in sorted(common)]


def plateau(curve: Sequence[Sequence[float]], n_val: int, window: int = WINDOW, z: float = Z) -> Dict[str, Any]:
    """The rule on one curve: {converged, gain (last minus the best before the last window), noise (one
    binomial SE of the last accuracy), points}."""
    if len(curve) < window + 1:
        return {"converged": False, "gain": None, "noise": None, "points": len(curve),
                "why": f"{len(curve)} evaluations, the rule needs {window + 1}"}
    last = float(curve[-1][1])
    gain = last - max(float(a) for _, a in curve[:-window])
    noise = math.sqrt(max(last * (1 - last), 0.0) / n_val)
    ok = gain <= z * noise
    return {"converged": ok, "gain": gain, "noise": noise, "points": len(curve),
            "why": "" if ok else f"still gaining {100 * gain:.2f} pt over its last {window} evaluations "
                                 f"(noise {100 * noise:.2f} pt)"}


def converged_runs(measures: Sequence[Mapping[str, Any]], n_val: int, plan: Optional[Mapping[str, Any]] = None
                   ) -> Optional[bool]:
    """The rule on the mean curve of one run's seeds (the sweep's test of its chosen point)."""
    r = rule_of(plan)
    return bool(plateau(mean_curve([m.get("curve") or [] for m in measures]), n_val, r["window"], r["z"])["converged"])


def arm_checks(report: Mapping[str, Any], arms: Mapping[str, Any], n_val: int,
               plan: Optional[Mapping[str, Any]] = None) -> Dict[str, Dict[str, Any]]:
    """Per arm of the report that trains (a classifier, or the masked patch prediction parent on its curve of
    accuracy on the corrupted validation patches): its convergence (the rule on its mean curve) and its rate
    (``interior`` of its family's grid or of its selector's group, ``fixed`` when the design fixes it, else the
    end it sits at); a fine-tune of a classifier on the same classes: whether it at least matches its parent
    (:func:`parent_check`). ``failed`` lists what keeps it from carrying a verdict, a parent's failures
    included (a fine-tune of an arm that failed starts from weights that cannot carry one)."""
    r, sweeps, values = rule_of(plan), report.get("sweeps") or {}, report.get("values") or {}
    groups: Dict[str, List[float]] = {}
    for a in arms.values():
        if a.group and a.x is not None:
            groups.setdefault(a.group, []).append(float(a.x))
    out: Dict[str, Dict[str, Any]] = {}
    for name, per_seed in (report.get("curves") or {}).items():
        a = arms.get(name)
        if a is None or a.kind not in ("train", "mpp"):
            continue
        conv = plateau(mean_curve(list(per_seed.values())), n_val, r["window"], r["z"])
        rate = _rate(a, sweeps, groups)
        failed = ([] if conv["converged"] else ["not converged: " + conv["why"]]) + \
            ([] if rate in ("interior", "fixed") else [f"rate at the {rate} of its grid"])
        out[name] = {"convergence": conv, "rate": rate, "failed": failed}
    for name, a in arms.items():  # an arm that trains but kept no curve cannot show it converged
        vals = values.get(name) or {}
        if name not in out and ((a.kind == "train" and vals.get("val_top1")) or (a.kind == "mpp" and vals)):
            out[name] = {"convergence": {"converged": False, "points": 0, "why": "no validation curve"},
                         "rate": _rate(a, sweeps, groups), "failed": ["not converged: no validation curve"]}
    for name in out:
        got = parent_check(name, arms, values, n_val, r["z"])
        if got is not None:
            out[name]["parent_check"] = got
            if not got["ok"]:
                out[name]["failed"].append(f"below its parent {got['parent']} on validation: {got['why']}")
    for name in _parents_first(out, arms):
        p = arms[name].parent
        if p in out and out[p]["failed"]:
            out[name]["failed"].append(f"its parent {p} failed the checks")
    return out


def parent_check(name: str, arms: Mapping[str, Any], values: Mapping[str, Any], n_val: int, z: float = Z
                 ) -> Optional[Dict[str, Any]]:
    """A fine-tune of a classifier on the parent's own classes (claim 5's) must at least match its parent:
    the mean over their common seeds of its validation accuracy may fall below the parent's validation
    accuracy, measured at the parent's resolution, by no more than ``z`` binomial standard errors of the
    parent's accuracy on ``n_val`` images (the convergence rule's noise). None for any other arm."""
    a = arms.get(name)
    parent = arms.get(a.parent) if a is not None and a.parent else None
    if parent is None or parent.kind != "train" or a.kind != "train" or a.classes != parent.classes:
        return None
    mine = (values.get(name) or {}).get("val_top1") or {}
    theirs = (values.get(a.parent) or {}).get("val_top1") or {}
    seeds = sorted(set(mine) & set(theirs), key=int)
    if not seeds:
        return {"parent": a.parent, "ok": False, "seeds": 0, "z": z, "why": "no seed measured for both"}
    ft, pa = (sum(float(v[s]) for s in seeds) / len(seeds) for v in (mine, theirs))
    noise = math.sqrt(max(pa * (1 - pa), 0.0) / n_val)
    ok = ft >= pa - z * noise
    size = (parent.model or {}).get("img_size")
    return {"parent": a.parent, "ok": ok, "seeds": len(seeds), "val": ft, "parent_val": pa, "gap": ft - pa,
            "noise": noise, "z": z, "parent_img_size": size,
            "why": "" if ok else f"{100 * (ft - pa):+.2f} pt against its parent's validation accuracy"
                                 f"{f' at {size} px' if size else ''} (noise {100 * noise:.2f} pt)"}


def _parents_first(names: Mapping[str, Any], arms: Mapping[str, Any]) -> List[str]:
    """``names`` ordered so that a parent comes before its fine-tunes (a failure passes down a chain)."""
    def depth(n: str) -> int:
        p = arms[n].parent
        return 0 if not p or p not in arms else 1 + depth(p)
    return sorted(names, key=depth)


def _rate(a: Any, sweeps: Mapping[str, Any], groups: Mapping[str, List[float]]) -> str:
    if a.lr is None:
        s = sweeps.get(a.family) or {}
        edge = s.get("edge")
        return "interior" if s and not edge else "single rate" if edge == "single" else \
            f"{edge} end" if edge else "unswept"
    xs = sorted(groups.get(a.group) or [])
    if a.group and len(xs) > 1 and a.x is not None:  # a member of a designed rate sweep (claim 2)
        return "largest end" if a.x >= xs[-1] else "smallest end" if a.x <= xs[0] else "interior"
    return "fixed"
