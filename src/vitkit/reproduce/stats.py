"""Statistics over seeds and the verdict rule (:data:`RULE`, printed in every report).

Values are kept per seed: ``{arm: {seed: value}}``. A comparison is a linear contrast C = sum_i w_i * arm_i
(a difference ``a - b``, or a difference of differences). When every arm of the contrast has the same seeds
it is **paired by seed** (arms of one seed share the data order, the data subset and, for fine-tunes, the
parent run): C is computed per seed and tested with a one-sample t-test over seeds (df = n - 1). Otherwise
(the seed sets differ, which is only allowed when the caller says so) it is a **Welch** contrast of the arm
means, with Welch-Satterthwaite degrees of freedom. Side-by-side speed timings are paired by round instead.

Each comparison yields p-values for its hypotheses; Holm's step-down correction runs over all the p-values of
one report at family-wise error 0.05; then:

* expected difference (``>``, a margin m of practical relevance): **reproduced** when C > ref significantly
  (two-sided t-test), **contradicted** when C < ref significantly, **not reproduced (effect ruled out)** when
  C < ref + m significantly (the paper's effect, at least m, is excluded), else **underpowered**;
* expected equality (``~``, margin m): **reproduced** when the TOST equivalence test puts |C - ref| < m
  significantly, **contradicted** when |C - ref| > m significantly, else **underpowered**;
* a rank correlation (claim 10): **reproduced** / **contradicted** when rho > 0 / < 0 significantly
  (the p-value of Spearman's test enters the Holm family), **underpowered** otherwise;
* fewer than 2 seeds, or a zero standard error (every seed gave the same contrast, e.g. two collapsed
  models): **underpowered**, and no p-value enters the family.

A claim is **contradicted** when any of its comparisons is, else **not reproduced** when any is, else
**reproduced** when all are, else **underpowered**.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError

ALPHA = 0.05  # family-wise error rate of one report (Holm)
CONFIDENCE = 0.95  # confidence intervals in the tables
REPRODUCED, RULED_OUT, CONTRADICTED, UNDERPOWERED = ("reproduced", "not reproduced (effect ruled out)",
                                                     "contradicted", "underpowered")
VERDICTS = (REPRODUCED, RULED_OUT, CONTRADICTED, UNDERPOWERED)

RULE = ("Values are kept per seed (report.json). A comparison is a contrast of arms (a difference, or a "
        "difference of differences). When all its arms have the same seeds it is paired by seed (the contrast "
        "is computed per seed, then a one-sample t-test, df = seeds - 1); otherwise a Welch t-test with "
        "Welch-Satterthwaite df; side-by-side speeds are paired by timing round. Tables give means with 95% "
        "t confidence intervals. Holm's correction runs over every p-value of the report at family-wise "
        f"error {ALPHA:g}. An expected difference is reproduced when it is significantly above the reference, "
        "contradicted when significantly below, not reproduced (effect ruled out) when it is significantly "
        "below the reference plus the stated margin, and underpowered otherwise. An expected equality is "
        "reproduced when a TOST equivalence test puts the difference within the stated margin, contradicted "
        "when it is significantly beyond the margin, and underpowered otherwise. Claim 10's rank correlation "
        "is reproduced or contradicted when Spearman's test is significant in either direction. Fewer than 2 "
        "seeds or a zero standard error give no test (underpowered). A claim is "
        "contradicted when any of its comparisons is, else not reproduced when any is, else reproduced when all "
        "are, else underpowered.")


class SeedMismatch(ConfigError):
    """Arms of a contrast lack seeds the others have: said, never silently dropped."""


def _t():
    from scipy.stats import t  # the reproduce extra

    return t


def t_quantile(df: float, q: float = 0.5 + CONFIDENCE / 2) -> float:
    return float(_t().ppf(q, df))


def _sf(x: float, df: float) -> float:
    """P(T > x) for Student's t with ``df``."""
    return float(_t().sf(x, df))


def t_tail(x: float, df: float) -> float:
    """P(T > x) for Student's t with ``df`` (a one-sided p-value)."""
    return _sf(x, df)


def summary(values: Sequence[Optional[float]]) -> Dict[str, Optional[float]]:
    """mean, sample standard deviation, n, standard error and the 95% t interval of the mean."""
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    if not n:
        return {"mean": None, "std": None, "n": 0, "se": None, "ci": None}
    mean = sum(vals) / n
    if n == 1:
        return {"mean": mean, "std": None, "n": 1, "se": None, "ci": None}
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    se = std / math.sqrt(n)
    h = t_quantile(n - 1) * se
    return {"mean": mean, "std": std, "n": n, "se": se, "ci": [mean - h, mean + h]}


def contrast(weights: Sequence[Tuple[str, float]], values: Mapping[str, Mapping[int, float]], *,
             allow_missing: bool = False) -> Dict[str, object]:
    """Estimate, standard error, degrees of freedom and 95% interval of sum_i w_i * arm_i.

    ``values``: per arm, {seed (or timing round): value}. Paired when every arm has the same keys; when the
    key sets differ, :class:`SeedMismatch` unless ``allow_missing`` (then Welch over what there is, and the
    result says which seeds were missing)."""
    cols = [{int(k): float(v) for k, v in (values.get(arm) or {}).items() if v is not None} for arm, _ in weights]
    empty = {"estimate": None, "se": None, "df": None, "n": 0, "ci": None, "design": None}
    if not all(cols):
        return {**empty, "missing": [arm for (arm, _), c in zip(weights, cols) if not c]}
    keys = [set(c) for c in cols]
    if all(k == keys[0] for k in keys):
        seeds = sorted(keys[0])
        per = [sum(w * c[s] for (_, w), c in zip(weights, cols)) for s in seeds]
        s = summary(per)
        df = s["n"] - 1 if s["se"] is not None else None
        return {"estimate": s["mean"], "se": s["se"], "df": df, "n": s["n"], "ci": s["ci"], "design": "paired",
                "per_seed": dict(zip(seeds, per))}
    union = set().union(*keys)
    missing = {arm: sorted(union - k) for (arm, _), k in zip(weights, keys) if union - k}
    if not allow_missing:
        raise SeedMismatch("missing seeds " + "; ".join(f"{a}: {m}" for a, m in missing.items())
                           + ": train them, or pass --allow-missing-seeds to compare unpaired")
    est, var, terms = 0.0, 0.0, []
    for (_, w), c in zip(weights, cols):
        s = summary(list(c.values()))
        est += w * s["mean"]
        if s["std"] is None:
            return {**empty, "estimate": est, "design": "welch", "missing_seeds": missing}
        term = w * w * s["std"] ** 2 / s["n"]
        var += term
        terms.append((term, s["n"]))
    se = math.sqrt(var)
    denom = sum(t * t / (n - 1) for t, n in terms)
    df = var * var / denom if denom > 0 else float(min(n for _, n in terms) - 1)
    h = t_quantile(df) * se
    return {"estimate": est, "se": se, "df": df, "n": min(n for _, n in terms), "ci": [est - h, est + h],
            "design": "welch", "missing_seeds": missing}


def p_values(c: Mapping[str, object], expect: str, ref: float, margin: Optional[float]) -> Dict[str, float]:
    """The p-values of one comparison's hypotheses (before Holm). ``>``: ``effect`` (two-sided, C = ref) and,
    with a margin, ``ruled_out`` (one-sided, C >= ref + margin); ``~``: ``equivalent`` (TOST, |C - ref| >=
    margin) and ``beyond`` (one-sided, |C - ref| <= margin). Empty without a standard error."""
    if expect not in (">", "~"):
        raise ConfigError(f"expect must be '>' or '~', got {expect!r}")
    est, se, df = c.get("estimate"), c.get("se"), c.get("df")
    if est is None or se is None or df is None or df <= 0 or not se > 0:  # a zero SE (identical seeds) tests nothing
        return {}
    d = float(est) - ref

    def z(x: float) -> float:  # the t statistic of x
        return x / se

    if expect == ">":
        out = {"effect": min(1.0, 2 * _sf(abs(z(d)), df))}
        if margin is not None:
            out["ruled_out"] = _sf(-z(d - margin), df)
        return out
    if margin is None:
        raise ConfigError("an expected equality needs a margin")
    return {"equivalent": max(_sf(z(d + margin), df), _sf(-z(d - margin), df)),
            "beyond": _sf(z(abs(d) - margin), df)}


def holm(pvals: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input order."""
    m = len(pvals)
    order = sorted(range(m), key=lambda i: pvals[i])
    adj, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvals[i]))
        adj[i] = running
    return adj


def decide(expect: str, estimate: Optional[float], ref: float, adjusted: Mapping[str, float],
           alpha: float = ALPHA) -> str:
    """A comparison's verdict from its Holm-adjusted p-values (the rule above)."""
    sig = {k for k, p in adjusted.items() if p < alpha}
    if expect == "~":
        return REPRODUCED if "equivalent" in sig else CONTRADICTED if "beyond" in sig else UNDERPOWERED
    if "effect" in sig:
        return REPRODUCED if estimate > ref else CONTRADICTED
    return RULED_OUT if "ruled_out" in sig else UNDERPOWERED


def combine(verdicts: Sequence[str]) -> str:
    """A claim's verdict from its comparisons'."""
    for v in (CONTRADICTED, RULED_OUT):
        if v in verdicts:
            return v
    return REPRODUCED if verdicts and all(v == REPRODUCED for v in verdicts) else UNDERPOWERED


def rank_correlation(x: Sequence[Optional[float]], y: Sequence[Optional[float]]) -> Dict[str, Optional[float]]:
    """Spearman rho and its two-sided p-value over the pairs where both are known."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None]
    if len(pairs) < 3:
        return {"rho": None, "p": None, "n": len(pairs)}
    from scipy.stats import spearmanr

    res = spearmanr([a for a, _ in pairs], [b for _, b in pairs])
    rho, p = float(res.statistic), float(res.pvalue)
    return {"rho": None if math.isnan(rho) else rho, "p": None if math.isnan(p) else p, "n": len(pairs)}


def decide_correlation(rho: Optional[float], adjusted_p: Optional[float], alpha: float = ALPHA) -> str:
    if rho is None or adjusted_p is None or adjusted_p >= alpha:
        return UNDERPOWERED
    return REPRODUCED if rho > 0 else CONTRADICTED


# --- power of the primary hypotheses, before training (the noncentral t) ---------------------------------
def power(effect: float, sd: float, n: int, level: float, expect: str = ">") -> float:
    """Power of the one-sample t-test (``">"``) or the TOST (``"~"``, ``effect`` = the margin, true
    difference 0) over ``n`` seeds of spread ``sd`` at one-sided level ``level``."""
    from scipy import stats as S

    if n < 2 or effect <= 0:
        return 0.0
    if not sd > 0:
        return 1.0
    df, se = n - 1, sd / math.sqrt(n)
    crit = float(S.t.ppf(1 - level, df))
    if expect == ">":
        return float(S.nct.sf(crit, df, effect / se))
    if expect != "~":
        raise ConfigError(f"power: unknown expectation {expect!r} (use '>' or '~')")
    from scipy.integrate import quad

    # s = sd * sqrt(X / df), X ~ chi2(df); given s, P(|d_bar| < m - crit * s / sqrt(n)) with d_bar ~ N(0, se^2)
    x_max = df * (effect / (crit * se)) ** 2  # beyond it the interval cannot fit inside the margins

    def given(x: float) -> float:
        half = effect - crit * se * math.sqrt(x / df)
        return (2 * S.norm.cdf(half / se) - 1) * S.chi2.pdf(x, df) if half > 0 else 0.0
    val, _ = quad(given, 0, x_max, limit=200)
    return float(min(1.0, max(0.0, val)))


def mde(sd: float, n: int, level: float, expect: str = ">", target: float = 0.8) -> Optional[float]:
    """The minimum detectable effect: the smallest effect (for ``"~"``: margin) with power ``target``."""
    from scipy.optimize import brentq

    if n < 2:
        return None
    if not sd > 0:
        return 0.0
    hi = sd
    while power(hi, sd, n, level, expect) < target:
        hi *= 2
        if hi > 1e6 * sd:
            return None
    return float(brentq(lambda e: power(e, sd, n, level, expect) - target, 1e-12 * sd, hi, xtol=1e-9 * sd))


def seeds_for(effect: float, sd: float, level: float, expect: str = ">", target: float = 0.8, lo: int = 5,
              hi: int = 20) -> Optional[int]:
    """The fewest seeds in [lo, hi] that reach ``target`` power, or None when even ``hi`` does not."""
    for n in range(lo, hi + 1):
        if power(effect, sd, n, level, expect) >= target:
            return n
    return None


def sd_upper(sd: float, df: int, quantile: float = 0.8) -> float:
    """The one-sided upper confidence limit (at ``quantile``) of a standard deviation from ``df`` degrees of
    freedom: sd * sqrt(df / chi2_{1-quantile}(df))."""
    from scipy import stats as S

    if df < 1:
        raise ConfigError("an SD needs at least 2 seeds (1 degree of freedom)")
    return float(sd * math.sqrt(df / S.chi2.ppf(1 - quantile, df)))


def pooled(sources: Iterable[Tuple[float, int]]) -> Tuple[Optional[float], int]:
    """(pooled SD, degrees of freedom) of several (SD, df) estimates of one spread: sqrt(sum df sd^2 / sum df)."""
    got = [(float(s), int(d)) for s, d in sources if s is not None and d and d > 0]
    df = sum(d for _, d in got)
    return (math.sqrt(sum(d * s * s for s, d in got) / df), df) if df else (None, 0)


def spread(values: Sequence[float]) -> Tuple[Optional[float], int]:
    """(sample SD, df) of per-seed values."""
    vals = [float(v) for v in values if v is not None]
    n = len(vals)
    if n < 2:
        return None, 0
    mean = sum(vals) / n
    return math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)), n - 1
