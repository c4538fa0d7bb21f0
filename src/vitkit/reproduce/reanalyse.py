"""The v1 report (means, standard deviations and seed counts per arm, no per-seed values) re-analysed under
the v2 rule as far as its numbers allow: Welch t-tests from the stored summaries (it cannot be paired by
seed), the v2 margins, TOST for "about equal", Holm over all its p-values, the four verdicts. It fixes the
statistics only, not the design (one learning rate, short schedules, claim 9 without an untrained reference,
claim 10 in-domain). ``python -m vitkit.reproduce.reanalyse`` writes docs/reproduction/v1/reanalysis.json.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List

from ..utils import PathLike
from . import stats
from .claims import MARGINS, SPEED

V1 = "docs/reproduction/v1/report.json"


def _welch(weights, summaries) -> Dict[str, Any]:
    """A contrast's estimate, SE and Welch-Satterthwaite df from per-arm (mean, std, n)."""
    est, var, denom, n_min = 0.0, 0.0, 0.0, None
    for arm, w in weights:
        s = summaries[arm]
        if s.get("mean") is None or s.get("std") is None or (s.get("n") or 0) < 2:
            return {"estimate": None, "se": None, "df": None}
        est += w * s["mean"]
        term = w * w * s["std"] ** 2 / s["n"]
        var, denom = var + term, denom + term * term / (s["n"] - 1)
        n_min = s["n"] if n_min is None else min(n_min, s["n"])
    se = math.sqrt(var)
    df = var * var / denom if denom > 0 else None
    h = stats.t_quantile(df) * se if df else None
    return {"estimate": est, "se": se, "df": df, "n": n_min, "ci": [est - h, est + h] if h else None,
            "design": "welch (from v1's summaries)"}


def reanalyse(report: Dict[str, Any]) -> Dict[str, Any]:
    rows: List[Dict[str, Any]] = []
    for c in report["claims"]:
        arms = {a["arm"]: a for a in c["arms"]}
        seen = set()
        for t in c["tests"]:
            rec: Dict[str, Any] = {"claim": c["id"], "text": t["text"]}
            if "rho" in t:
                rec.update(kind="correlation", rho=t["rho"], n=t["n"], p_values={"effect": t["p"]})
                rows.append(rec)
                continue
            weights = [tuple(w) for w in t["weights"]]
            key = (t["metric"], tuple(sorted((a, abs(w)) for a, w in weights)))
            margin = MARGINS.get(t["metric"])
            if t["metric"] == SPEED:  # side-by-side rounds: paired by round, as in v1
                cst = stats.contrast(weights, {a: dict(enumerate(arms[a]["rounds"])) for a, _ in weights})
            elif all(t["metric"] in arms[a] for a, _ in weights):
                cst = _welch(weights, {a: arms[a][t["metric"]] for a, _ in weights})
            else:  # a one-arm test whose metric v1 kept only in the test itself: a one-sample t-test
                df = t["n_min"] - 1
                h = stats.t_quantile(df) * t["se"]
                cst = {"estimate": t["estimate"], "se": t["se"], "df": df, "n": t["n_min"],
                       "ci": [t["estimate"] - h, t["estimate"] + h], "design": "one-sample"}
            rec.update(kind="contrast", metric=t["metric"], expect=t["expect"], ref=t["ref"], margin=margin,
                       weights=weights, v1_verdict=t["verdict"],
                       **{k: cst.get(k) for k in ("estimate", "se", "df", "ci", "design")})
            rec["p_values"] = {} if key in seen else stats.p_values(cst, t["expect"], t["ref"], margin)
            if key in seen:
                rec["duplicate"] = True
            seen.add(key)
            rows.append(rec)
    family = [(r, k, p) for r in rows for k, p in r["p_values"].items()]
    for (r, k, _), p in zip(family, stats.holm([p for _, _, p in family])):
        r.setdefault("p_adjusted", {})[k] = p
    for r in rows:
        adj = r.get("p_adjusted", {})
        if r["kind"] == "correlation":
            r["verdict"] = stats.decide_correlation(r["rho"], adj.get("effect"))
        else:
            r["verdict"] = stats.UNDERPOWERED if r.get("duplicate") else stats.decide(r["expect"], r["estimate"],
                                                                                       r["ref"], adj)
    claims = {}
    for r in rows:
        claims.setdefault(r["claim"], []).append(r["verdict"])
    return {"source": V1, "rule": "v2 (Welch from summaries; Holm over all p-values)", "tests_in_family": len(family),
            "tests": rows, "claims": {str(k): stats.combine(v) for k, v in claims.items()}}


def write(reference: PathLike = V1) -> Path:
    path = Path(reference)
    out = path.parent / "reanalysis.json"
    out.write_text(json.dumps(reanalyse(json.loads(path.read_text())), indent=1) + "\n")
    return out


if __name__ == "__main__":
    print(write())
