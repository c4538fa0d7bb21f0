"""Statistics over seeds and the verdict rule.

Each comparison is a linear contrast C = sum_i w_i * mean_i of arm means (a difference ``a - b``, or a
difference of differences). Its standard error pools the seeds' sample variances of the arms:
SE = sqrt(sum_i w_i^2 * s_i^2 / n_i). With K = 2:

* expected direction (``>``): **supports** when C - ref > K * SE, **contradicts** when C - ref < -K * SE,
  otherwise **inconclusive**;
* expected equality (``~``): **supports** when |C - ref| <= K * SE and K * SE <= margin (no difference, and
  the seeds could have shown one as large as the margin), **contradicts** when |C - ref| > K * SE and
  |C - ref| > margin, otherwise **inconclusive**;
* fewer than 2 seeds in any arm: no standard error, **inconclusive**.

Speeds timed side by side (one value per round and arm, the arms alternated within each round) are paired:
the contrast is taken per round and SE is the standard error of its mean over the rounds.

A claim supports when every comparison supports, contradicts when any contradicts, and is inconclusive
otherwise. Claim 10 is a Spearman rank correlation rho over models (the seed means): supports when rho > 0
with p < 0.05, contradicts when rho < 0 with p < 0.05, otherwise inconclusive.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

K = 2.0  # standard errors a difference must exceed to count
MARGIN = 0.01  # for "~" on accuracies: one point; the paper's own spread in Table 8 is 0.3 points at ImageNet scale
P_LEVEL = 0.05
VERDICTS = ("supports", "contradicts", "inconclusive")

RULE = (f"A comparison is a contrast of arm means over seeds (a difference, or a difference of differences) with "
        f"standard error SE = sqrt(sum w_i^2 s_i^2 / n_i) pooled from the seeds' sample variances. An expected "
        f"difference counts (supports) when it exceeds {K:g} SE in the expected direction and contradicts when it "
        f"exceeds {K:g} SE in the other; an expected equality supports when the difference is within {K:g} SE "
        f"and {K:g} SE is at most {100 * MARGIN:g} point, and contradicts when the difference exceeds both {K:g} "
        f"SE and {100 * MARGIN:g} point; anything else, or a single seed, is inconclusive. A claim supports when "
        f"all its comparisons do, contradicts when any does, and is otherwise inconclusive. Claim 10: Spearman "
        f"rho over the models, supports when rho > 0 with p < {P_LEVEL}, contradicts when rho < 0 with "
        f"p < {P_LEVEL}. Speeds timed side by side are paired by round: their SE is that of the mean per-round "
        f"contrast.")


def summary(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """mean, sample standard deviation (None for one value), n, and the standard error of the mean."""
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    if not n:
        return {"mean": None, "std": None, "n": 0, "se": None}
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "n": n, "se": std / math.sqrt(n) if std is not None else None}


def contrast(weights: Sequence[Tuple[str, float]], values: Dict[str, Sequence[float]], *, paired: bool = False
             ) -> Dict[str, Optional[float]]:
    """Estimate and pooled standard error of sum_i w_i * mean(values[arm_i]). ``paired``: the j-th values of
    the arms were measured together (one round of side-by-side timing), so the standard error is that of the
    mean of the per-round contrasts sum_i w_i * values[arm_i][j], from which what drifts between rounds
    (the machine's load, its clock) cancels."""
    if paired:
        cols = [list(values.get(arm, [])) for arm, _ in weights]
        if not all(cols):  # an arm not timed: nothing to compare, as below
            return {"estimate": None, "se": None, "n_min": 0}
        if len({len(c) for c in cols}) != 1 or any(v is None for c in cols for v in c):
            raise ValueError("paired values need one value per round for every arm")
        s = summary([sum(w * v for (_, w), v in zip(weights, rnd)) for rnd in zip(*cols)])
        return {"estimate": s["mean"], "se": s["se"], "n_min": s["n"]}
    est, var, n_min = 0.0, 0.0, None
    for arm, w in weights:
        s = summary(values.get(arm, []))
        if s["mean"] is None:
            return {"estimate": None, "se": None, "n_min": 0}
        est += w * s["mean"]
        n_min = s["n"] if n_min is None else min(n_min, s["n"])
        var = None if var is None or s["std"] is None else var + w * w * s["std"] ** 2 / s["n"]
    return {"estimate": est, "se": math.sqrt(var) if var is not None else None, "n_min": n_min}


def verdict(estimate: Optional[float], se: Optional[float], expect: str = ">", ref: float = 0.0,
            margin: float = MARGIN) -> str:
    """One comparison's verdict by the rule above."""
    if expect not in (">", "~"):
        raise ValueError(f"expect must be '>' or '~', got {expect!r}")
    if estimate is None or se is None:
        return "inconclusive"
    d = estimate - ref
    if expect == ">":
        if d > K * se:
            return "supports"
        if d < -K * se:
            return "contradicts"
        return "inconclusive"
    if abs(d) <= K * se and K * se <= margin:
        return "supports"
    if abs(d) > K * se and abs(d) > margin:
        return "contradicts"
    return "inconclusive"


def combine(verdicts: Sequence[str]) -> str:
    """A claim's verdict from its comparisons'."""
    if not verdicts:
        return "inconclusive"
    if any(v == "contradicts" for v in verdicts):
        return "contradicts"
    if all(v == "supports" for v in verdicts):
        return "supports"
    return "inconclusive"


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> Dict[str, Optional[float]]:
    """Spearman rho and its two-sided p-value, with the verdict of claim 10."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if len(pairs) < 3:
        return {"rho": None, "p": None, "n": len(pairs), "verdict": "inconclusive"}
    from scipy.stats import spearmanr

    res = spearmanr([a for a, _ in pairs], [b for _, b in pairs])
    rho, p = float(res.statistic), float(res.pvalue)
    if math.isnan(rho):
        v = "inconclusive"
    else:
        v = "supports" if rho > 0 and p < P_LEVEL else "contradicts" if rho < 0 and p < P_LEVEL else "inconclusive"
    return {"rho": None if math.isnan(rho) else rho, "p": None if math.isnan(p) else p, "n": len(pairs),
            "verdict": v}


def resolve(name: str, groups: Dict[str, List[Tuple[float, str]]], val: Dict[str, Sequence[float]]) -> str:
    """An arm name, or a selector resolved on validation accuracy: ``best:GROUP`` (the group's arm with the
    best mean validation accuracy), ``GROUP@best:OTHER`` (the arm of GROUP at the x of best:OTHER)."""
    if name.startswith("best:"):
        members = groups.get(name[5:])
        if not members:
            raise ValueError(f"selector {name!r}: no arms in group {name[5:]!r}")
        scored = [(summary(val.get(arm, []))["mean"], arm) for _, arm in members]
        scored = [(s, a) for s, a in scored if s is not None]
        if not scored:
            raise ValueError(f"selector {name!r}: no validation results yet")
        return max(scored)[1]
    if "@best:" in name:
        group, _, other = name.partition("@")
        x = dict((arm, xv) for xv, arm in groups[other.split(":", 1)[1]])[resolve(other, groups, val)]
        for xv, arm in groups.get(group, []):
            if xv == x:
                return arm
        raise ValueError(f"selector {name!r}: group {group!r} has no arm at x={x}")
    return name
