"""The v3 rule (a report with ``plan``): the pre-registered primary hypothesis of each claim decides the claim,
Holm over the primaries only; everything else is secondary (unadjusted).

For each testable primary: its one-sided (``>``) or TOST (``~``) p-value; Holm's step-down over those p-values
at ``alpha``; the interval shown is the two-sided 1 - 2a interval, ``a`` the one-sided level at which Holm
decided that hypothesis, so the interval and the verdict always agree (see the plan's ``primary_rule``). A
claim the design declared *not testable at this budget* adds no p-value. An arm of a primary that failed the
convergence or interior-rate check (``report["arm_checks"]``) leaves its claim without a verdict. Every other
test is secondary: its unadjusted p-values and 95% interval, and a reading that never enters a claim's verdict.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..errors import ConfigError
from . import stats
from .claims import SPEED
from .rule import check_unchanged, per_seed

INCONCLUSIVE, NOT_TESTABLE, NO_VERDICT = "inconclusive", "not testable at this budget", "no verdict"
VERDICTS = (stats.REPRODUCED, stats.RULED_OUT, stats.CONTRADICTED, INCONCLUSIVE, NOT_TESTABLE, NO_VERDICT,
            stats.UNDERPOWERED)


def holm_levels(pvals: List[float], alpha: float) -> List[float]:
    """The one-sided level at which Holm's step-down decided each p-value: alpha / (m - j) at its step j for
    those rejected, the level of the first step not rejected for the rest (input order)."""
    m = len(pvals)
    order = sorted(range(m), key=lambda i: pvals[i])
    levels, stop = [0.0] * m, None
    for j, i in enumerate(order):
        if stop is None and not pvals[i] * (m - j) < alpha:
            stop = alpha / (m - j)
        levels[i] = alpha / (m - j) if stop is None else stop
    return levels


def _one_sided(t: Mapping[str, Any]) -> Optional[float]:
    est, se, df = t.get("estimate"), t.get("se"), t.get("df")
    if est is None or se is None or not df or not se > 0:
        return None
    if t["expect"] == ">":
        return stats.t_tail((est - t["ref"]) / se, df)
    return t["p_values"].get("equivalent")


def evaluate_v3(report: Dict[str, Any]) -> None:
    """Every test's estimate, interval, p-values and verdict, every claim's verdict (in place)."""
    plan, values, alpha = report["plan"], report["values"], float(report["plan"]["alpha"])
    check_unchanged((report.get("plans") or {}).values(), plan["sha256"])
    design = (report.get("design") or {}).get("claims") or {}
    family: List[Dict[str, Any]] = []
    for c in report["claims"]:
        p = plan["primary"].get(int(c["id"])) or plan["primary"].get(str(c["id"]))
        for t in c["tests"]:
            for k in ("verdict", "note", "level", "ci_level", "power", "mde", "p_one_sided"):
                t.pop(k, None)
            t["role"] = "primary" if p and t.get("text") == p["test"] else "secondary"
            if t.get("kind") == "correlation":
                t["p_values"] = {} if t.get("p") is None else {"effect": t["p"]}
            elif "error" not in t and not _untestable(design, c["id"]):
                if t["role"] == "primary":
                    t["margin"] = float(p["effect"])
                fill_contrast(t, values, report)
            t["p_adjusted"] = dict(t.get("p_values") or {})  # secondary: unadjusted, said so
        prim = next((t for t in c["tests"] if t["role"] == "primary"), None)
        c["primary"] = prim and prim["text"]
        if prim is None or "error" in prim:
            continue
        d = design.get(str(c["id"])) or design.get(int(c["id"])) or {}
        prim["effect"] = float(p["effect"])
        prim["p_one_sided"] = _one_sided(prim)
        if _untestable(design, c["id"]):
            prim["verdict"], prim["note"] = NOT_TESTABLE, d.get("reason", "")
            prim["mde"], prim["power_planned"] = d.get("mde"), d.get("power")
        elif prim["p_one_sided"] is not None:
            family.append(prim)
        if d:
            prim["power_planned"], prim["seeds_planned"], prim["mde_planned"] = d.get("power"), d.get("seeds"), \
                d.get("mde")
    levels = holm_levels([t["p_one_sided"] for t in family], alpha)
    adjusted = stats.holm([t["p_one_sided"] for t in family])
    for t, a, q in zip(family, levels, adjusted):
        t["level"], t["p_adjusted"] = a, {"primary": q}
        h = stats.t_quantile(t["df"], 1 - a) * t["se"]
        t["ci"], t["ci_level"] = [t["estimate"] - h, t["estimate"] + h], 1 - 2 * a
        t["verdict"] = _decide(t, q < alpha)
    report["tests_in_family"] = len(family)
    for c in report["claims"]:
        for t in c["tests"]:
            if t["role"] == "primary":
                _power(t, len(family), alpha, float(plan["power"]))
                t.setdefault("verdict", stats.UNDERPOWERED)
                _gate(t, report.get("arm_checks") or {}, [r["arm"] for r in c.get("arms") or []])
            else:
                _secondary(t)
                unmet = _precondition(t, c, report, alpha) if t.get("requires") and "p_values" in t else []
                if unmet:
                    t["verdict"], t["note"] = NO_VERDICT, "its precondition is not met on validation: " + \
                        "; ".join(unmet)
        prim = next((t for t in c["tests"] if t["role"] == "primary"), None)
        c["verdict"] = prim["verdict"] if prim else stats.UNDERPOWERED


def _untestable(design: Mapping[Any, Any], cid: int) -> bool:
    d = design.get(str(cid)) or design.get(int(cid)) or {}
    return bool(d) and not d.get("testable", True)


def _decide(t: Dict[str, Any], rejected: bool) -> str:
    lo, hi = t["ci"]
    if t["expect"] == "~":
        m = t["margin"]
        return stats.REPRODUCED if rejected else stats.CONTRADICTED if (lo > m or hi < -m) else INCONCLUSIVE
    if rejected:
        return stats.REPRODUCED
    return stats.CONTRADICTED if hi < t["ref"] else stats.RULED_OUT if hi < t["ref"] + t["effect"] else INCONCLUSIVE


def _power(t: Dict[str, Any], m: int, alpha: float, target: float) -> None:
    """Power for the effect of interest and the MDE at the seeds run, with the campaign's own spread, at the
    planning level alpha / m (a lower bound of Holm's)."""
    if t.get("se") is None or not t.get("n") or t["n"] < 2:
        return
    sd, level = t["se"] * t["n"] ** 0.5, alpha / max(1, m)
    t["power"] = stats.power(t["effect"], sd, t["n"], level, t["expect"])
    t["mde"] = stats.mde(sd, t["n"], level, t["expect"], target)


def _gate(t: Dict[str, Any], checks: Mapping[str, Any], claim_arms: List[str]) -> None:
    """No verdict from a primary one of whose arms failed the arm checks (a slope reads every arm of its
    claim)."""
    names = [a for a, _ in t.get("weights") or []] if t.get("kind") != "slope" else claim_arms
    failed = [f"{a} ({', '.join(checks[a]['failed'])})" for a in names if (checks.get(a) or {}).get("failed")]
    if failed and t["verdict"] != NOT_TESTABLE:
        t["verdict"], t["note"] = NO_VERDICT, "arms that cannot carry a verdict: " + "; ".join(failed)


def _precondition(t: Dict[str, Any], c: Mapping[str, Any], report: Dict[str, Any], alpha: float) -> List[str]:
    """The tests ``t`` requires that are not met on the validation split (never on test): each required
    contrast recomputed on validation accuracy, met when its one-sided paired p-value is below ``alpha``; what
    was found is kept in ``t["gate"]``."""
    unmet, t["gate"] = [], []
    for text in t["requires"]:
        req = next((x for x in c["tests"] if x.get("text") == text and "error" not in x), None)
        if req is None:
            unmet.append(text)
            continue
        v = {k: req[k] for k in ("text", "kind", "weights", "expect", "ref", "margin")}
        v["metric"] = "val_top1"
        fill_contrast(v, report["values"], report)
        p = stats.t_tail((v["estimate"] - v["ref"]) / v["se"], v["df"]) if v.get("se") and v.get("df") else None
        t["gate"].append({"requires": text, "metric": "val_top1", "estimate": v.get("estimate"), "p": p})
        if p is None or not p < alpha:
            unmet.append(text)
    return unmet


def _secondary(t: Dict[str, Any]) -> None:
    if t.get("kind") == "correlation":
        t["verdict"] = stats.decide_correlation(t.get("rho"), t["p_adjusted"].get("effect"))
    elif "error" in t:
        t["verdict"] = stats.UNDERPOWERED
    elif "p_values" not in t:  # its claim is not testable at this budget: not trained
        t["verdict"] = NOT_TESTABLE
    else:
        t["verdict"] = stats.decide(t["expect"], t["estimate"], t["ref"], t["p_adjusted"])
    t["ci_level"] = stats.CONFIDENCE


def primary_values(report: Mapping[str, Any]) -> Dict[int, Dict[str, float]]:
    """Per claim, its primary's per-seed values (what an independent re-derivation starts from)."""
    out: Dict[int, Dict[str, float]] = {}
    for c in report["claims"]:
        for t in c["tests"]:
            if t.get("role") == "primary" and "error" not in t:
                out[int(c["id"])] = per_seed(t, report["values"])
    return out


def fill_contrast(t: Dict[str, Any], values: Dict[str, Any], report: Dict[str, Any]) -> None:
    """Fill in ``t`` (in place): a contrast of arms paired by seed (or Welch, when allowed), or a ``slope``
    record's one-sample test of its per-seed values (claim 10)."""
    if t.get("kind") == "slope":
        s = stats.summary(list((t.get("per_seed") or {}).values()))
        t.update({"estimate": s["mean"], "se": s["se"], "df": s["n"] - 1 if s["n"] else None, "n": s["n"],
                  "ci": s["ci"], "design": "per seed"})
        t["p_values"] = stats.p_values(t, t["expect"], t["ref"], t["margin"])
        return
    per = {a: {int(s): v for s, v in (values.get(a) or {}).get(t["metric"], {}).items()} for a, _ in t["weights"]}
    if t["metric"] != SPEED:
        versions = {report["code"].get(a, {}).get(str(s)) for a in per for s in per[a]}
        if len(versions) > 1 and not report.get("allow_mixed_code"):
            mixed = ", ".join(sorted(map(str, versions)))
            raise ConfigError(f"'{t['text']}' compares runs of different code versions ({mixed}):"
                              f" retrain them with one version, or pass --allow-mixed-code")
    try:
        cst = stats.contrast(t["weights"], per, allow_missing=bool(report.get("allow_missing_seeds")))
    except stats.SeedMismatch as err:
        raise ConfigError(f"'{t['text']}': {err}") from None
    t.update({k: cst.get(k) for k in ("estimate", "se", "df", "n", "ci", "design")})
    if cst.get("missing_seeds"):
        t["missing_seeds"] = cst["missing_seeds"]
    t["p_values"] = stats.p_values(cst, t["expect"], t["ref"], t["margin"])
