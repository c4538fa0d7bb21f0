"""The pre-registered analysis plan (``plan_v3.json`` beside this module): one primary hypothesis per claim with
its direction, effect of interest and why; the correction, the power wanted and the seed range; the
convergence, learning-rate and speed rules. Every run records the plan's SHA-256 when it starts, and the
report refuses a campaign whose runs were started under another plan (the plan cannot change after the
first run). Loading reads JSON only, never code.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import ConfigError
from ..utils import PathLike
from .analyses import SLOPE_TEXT, transfer_slopes
from .claims import Arm, Claim, Test, parents_first, selector_arms
from .stats import pooled, spread

PLAN = Path(__file__).with_name("plan_v3.json")


def plan_sha(path: PathLike = PLAN) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_plan(path: Optional[PathLike] = None) -> Dict[str, Any]:
    """The plan as a dict with ``sha256`` (of the file's bytes) and ``file`` added, checked against the claims
    table: one primary per claim naming one of its tests, ``>`` or ``~``, a positive effect."""
    from .catalog import claims_table

    path = Path(path or PLAN)
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"analysis plan {path}: cannot be read as JSON ({err})") from None
    claims = claims_table()
    prim = plan.get("primary") or {}
    for key in ("alpha", "power", "seeds", "spread", "correction", "primary_rule", "secondary"):
        if key not in plan:
            raise ConfigError(f"analysis plan {path}: no {key!r}")
    for cid, p in prim.items():
        c = claims.get(int(cid))
        texts = {t.text for t in c.tests} | ({SLOPE_TEXT} if c and c.analysis else set()) if c else set()
        if p.get("test") not in texts:
            raise ConfigError(f"analysis plan {path}: claim {cid}'s primary {p.get('test')!r} is not one of its tests")
        if p.get("expect") not in (">", "~") or not float(p.get("effect", 0)) > 0 or not p.get("why"):
            raise ConfigError(f"analysis plan {path}: claim {cid}'s primary needs expect '>' or '~', an effect > 0 "
                              f"and a reason ('why')")
    if not 5 <= plan["seeds"]["min"] <= plan["seeds"]["max"]:
        raise ConfigError(f"analysis plan {path}: seeds.min must be at least 5 and at most seeds.max")
    return {**plan, "primary": {int(k): v for k, v in prim.items()}, "sha256": plan_sha(path), "file": path.name}


def check_unchanged(recorded: Iterable[Optional[str]], sha: str) -> None:
    """Refuse runs started under another plan (``recorded``: each run's plan hash; None: before plans)."""
    other = sorted({r for r in recorded if r != sha}, key=str)
    if other:
        raise ConfigError(f"the analysis plan changed after the campaign's first run (runs recorded plan "
                          f"{', '.join(str(o)[:12] for o in other)}, the plan now is {sha[:12]}): restore the plan "
                          f"the runs were started with, or start a new campaign in another --out")


def per_seed(t: Mapping[str, Any], values: Mapping[str, Any]) -> Dict[str, float]:
    """A test record's per-seed value: its contrast computed per seed over the seeds all its arms have, or a
    slope record's own values."""
    if t.get("kind") == "slope":
        return dict(t.get("per_seed") or {})
    cols = [((values.get(a) or {}).get(t["metric"]) or {}, float(w)) for a, w in t["weights"]]
    seeds = set.intersection(*[set(c) for c, _ in cols]) if cols else set()
    return {s: sum(w * float(c[s]) for c, w in cols) for s in sorted(seeds, key=int)}


def report_spreads(report: Mapping[str, Any], plan: Mapping[str, Any]) -> Dict[int, Tuple[Optional[float], int]]:
    """Per claim: (SD, df) of its primary's per-seed values in an evaluated report (v2 or v3); claim 10's slope
    is computed from the report's values when the report predates it."""
    out: Dict[int, Tuple[Optional[float], int]] = {}
    for c in report.get("claims", []):
        p = plan["primary"].get(int(c["id"]))
        if p is None:
            continue
        t = next((t for t in c["tests"] if t.get("text") == p["test"] and "error" not in t), None)
        if t is None and p["test"] == SLOPE_TEXT:
            vals = {n: {k: {int(s): v for s, v in d.items()} for k, d in report["values"].get(n, {}).items()}
                    for n in (r["arm"] for r in c["arms"])}
            t = {"kind": "slope", "per_seed": transfer_slopes([r["arm"] for r in c["arms"]], vals)}
        if t is not None:
            out[int(c["id"])] = spread(list(per_seed(t, report["values"]).values()))
    return out


def prior_spreads(plan: Mapping[str, Any]) -> Dict[int, Tuple[Optional[float], int]]:
    """The plan's prior: each primary's (SD, df) in the committed v2 campaign."""
    return {int(k): (v.get("sd"), int(v.get("df") or 0)) for k, v in (plan.get("prior") or {}).items()}


def planning_sds(sources: Iterable[Mapping[int, Tuple[Optional[float], int]]], plan: Mapping[str, Any]
                 ) -> Dict[int, Dict[str, Any]]:
    """Per claim: the pooled SD of its primary over ``sources`` (each from :func:`report_spreads`), its df and
    the upper confidence limit the planner uses (None where no source has 2 seeds)."""
    from .stats import sd_upper

    sources = list(sources)
    out: Dict[int, Dict[str, Any]] = {}
    for cid in plan["primary"]:
        sd, df = pooled(s.get(cid, (None, 0)) for s in sources)
        out[cid] = {"sd": sd, "df": df,
                    "sd_plan": None if sd is None else sd_upper(sd, df, float(plan["spread"]["quantile"]))}
    return out


def primary_test(c: Claim, plan: Mapping[str, Any]) -> Optional[Test]:
    p = plan["primary"].get(c.id)
    return next((t for t in c.tests if p and t.text == p["test"]), None)


def claim_arms(c: Claim, arms: Mapping[str, Arm], plan: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The arms a claim trains (parents first): all of them, or with ``plan`` only those its primary reads
    (claim 10's slope and claim 9's reference read every arm of the claim)."""
    t = primary_test(c, plan) if plan else None
    wanted = ([m for n, _ in t.weights for m in selector_arms(n, arms)] if t is not None else
              list(c.arms) + [m for x in c.tests for n, _ in x.weights for m in selector_arms(n, arms)])
    return parents_first(arms, wanted)
