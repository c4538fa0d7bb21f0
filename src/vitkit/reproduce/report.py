"""report.json (every value per seed, every test with its p-values and verdict) and report.md with one PNG
per claim (:mod:`.figures`). :func:`evaluate` derives every estimate and verdict from report.json's own
per-seed values, so anyone can re-check them from the JSON alone."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..utils import PathLike, atomic_path, write_json_atomic
from . import stats
from .budget import Budget
from .claims import MARGINS, SPEED, Arm, Claim, Test
from .measure import code_id
from .verdict import evaluate_v3, fill_contrast

PER_SEED = ("test_top1", "val_top1", "fewshot_5", "fewshot_10", "late_gain", "train_macs", "lr", "l0_mean_dist",
            "l0_max_rel", "l0_min_rel", "l0_spread_rel", "dist_growth", "posemb_rowcol")


def _groups(arms: Dict[str, Arm]) -> Dict[str, List[Tuple[float, str]]]:
    out: Dict[str, List[Tuple[float, str]]] = {}
    for a in arms.values():
        if a.group:
            out.setdefault(a.group, []).append((a.x, a.name))
    return {g: sorted(v) for g, v in out.items()}


def _arm_values(ms: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    return {k: {str(m["seed"]): m[k] for m in ms if m.get(k) is not None} for k in PER_SEED
            if any(m.get(k) is not None for m in ms)}


def build(claims: Sequence[Claim], arms: Dict[str, Arm], alias: Dict[str, str],
          measures: Dict[str, List[Dict[str, Any]]], budget: Budget, *, command: str = "", machine: str = "",
          speeds: Optional[Dict[str, List[float]]] = None, sweeps: Optional[Dict[str, Any]] = None,
          allow_mixed_code: bool = False, allow_missing_seeds: bool = False, plan: Optional[Dict[str, Any]] = None,
          design: Optional[Dict[str, Any]] = None, expected: Optional[Dict[str, List[int]]] = None
          ) -> Dict[str, Any]:
    """The report as a JSON-ready dict, evaluated. ``measures`` is keyed by run; ``alias`` maps every arm
    name to its run; ``speeds`` (keyed by run) holds the side-by-side speeds, one value per round. ``plan``
    (v3): the analysis plan, evaluated by :func:`vitkit.reproduce.primary.evaluate_v3`, with the ``design``
    made before training and the seeds each trained arm was to have (``expected``; default the budget's)."""
    speeds = speeds or {}
    used = sorted({n for c in claims for n in c.arms} | {n for c in claims for t in c.tests for n, _ in t.weights
                                                         if isinstance(n, str)} | _candidates(claims, arms))
    used = sorted(set(used) | {arms[n].parent for n in used if arms[n].parent})  # parents: their checks pass down
    values, code, curves, missing = {}, {}, {}, {}
    for n in used:
        ms = measures.get(alias.get(n, n), [])
        values[n] = _arm_values(ms)
        if alias.get(n, n) in speeds:
            values[n][SPEED] = {str(i): v for i, v in enumerate(speeds[alias[n]])}
        code[n] = {str(m["seed"]): code_id(m.get("code")) for m in ms}
        curves[n] = {str(m["seed"]): m.get("curve") for m in ms if m.get("curve")}
        want = budget.seeds if expected is None else expected.get(n, ())
        lack = sorted(set(want) - {int(m["seed"]) for m in ms})
        if lack:
            missing[n] = lack
    groups = _groups(arms)
    val = {n: list(v.get("val_top1", {}).values()) for n, v in values.items()}
    out: Dict[str, Any] = {
        "version": 2, "command": command, "machine": machine, "budget": budget.name, "budget_note": budget.note,
        "seeds": list(budget.seeds), "rule": stats.RULE, "alpha": stats.ALPHA, "margins": MARGINS,
        "data": budget.data_note, "validation": (f"{budget.val_size:,} images held out of the training split"
                                                 if budget.val_size else "the recipes' 5,000 training images, 500 "
                                                 "per class, the same for every seed and for MPP"),
        "test": (f"{budget.test_images:,} test images (a class-stratified subset, the same for every run)"
                 if budget.test_images else "the whole test split"),
        "sweeps": sweeps or {}, "values": values, "code": code, "curves": curves, "missing_seeds": missing,
        "allow_mixed_code": allow_mixed_code, "allow_missing_seeds": allow_missing_seeds, "claims": []}
    for c in claims:
        out["claims"].append(_claim_record(c, arms, alias, measures, values, groups, val))
    if plan is not None:
        out.update({"version": 3, "plan": plan, "design": design, "rule": plan["primary_rule"],
                    "alpha": plan["alpha"], "correction": plan["correction"], "secondary": plan["secondary"],
                    "plans": {f"{alias.get(n, n)}/{m['seed']}": m.get("plan") for n in used
                              for m in measures.get(alias.get(n, n), [])}})
        from .convergence import arm_checks
        from .estimate import VAL_IMAGES
        out["arm_checks"] = arm_checks(out, arms, budget.val_size or VAL_IMAGES, plan)
    evaluate(out)
    return out


def _claim_record(c: Claim, arms: Dict[str, Arm], alias: Dict[str, str], measures: Dict[str, List[Dict[str, Any]]],
                  values: Dict[str, Any], groups: Dict[str, List[Tuple[float, str]]], val: Dict[str, List[float]]
                  ) -> Dict[str, Any]:
    """One claim of the report, not yet evaluated: its arms (sizes; mean distance matrices for the distance
    figure), its contrasts with the selectors resolved on ``val`` and any claim-specific analysis."""
    rec: Dict[str, Any] = {"id": c.id, "title": c.title, "paper": c.paper, "setup": c.setup, "can": c.can,
                           "cannot": c.cannot, "metric": c.metric, "figure": c.figure, "arms": [], "tests": []}
    for name in c.arms:
        a, ms = arms[name], measures.get(alias.get(name, name), [])
        row = {"arm": name, "label": a.label or name, "run": alias.get(name, name), "group": a.group, "x": a.x,
               "params": ms[0]["params"] if ms else None, "macs": ms[0]["macs"] if ms else None}
        if c.figure == "distance":
            row["distance"] = _mean_matrix([m.get("distance") for m in ms])
            row["uniform_distance"] = ms[0].get("uniform_distance") if ms else None
        rec["arms"].append(row)
    rec["tests"] += [_contrast_record(t, alias, groups, val) for t in c.tests]
    if c.analysis is not None:
        extra = c.analysis(c, {n: {k: {int(s): v for s, v in d.items()} for k, d in values[n].items()}
                               for n in c.arms if n in values})
        rec["points"] = extra.get("points", [])
        rec["tests"] += extra.get("tests", [])
    return rec


def _contrast_record(t: Test, alias: Dict[str, str], groups: Dict[str, List[Tuple[float, str]]],
                     val: Dict[str, List[float]]) -> Dict[str, Any]:
    """One contrast test, its selectors resolved to arms (an ``error`` when they cannot be, or when two of
    its arms are one run)."""
    try:
        weights = [(n if isinstance(n, str) else n.resolve(groups, val), w) for n, w in t.weights]
        shared = [a for i, (a, _) in enumerate(weights) if alias.get(a, a) in
                  {alias.get(b, b) for b, _ in weights[:i]}]
        if shared:  # two names of one run are not two arms
            raise ConfigError(f"{', '.join(shared)} is the same run as another arm of this comparison")
    except ConfigError as err:
        return {"text": t.text, "kind": "contrast", "error": str(err)}
    margin = t.margin if t.margin is not None else MARGINS.get(t.metric)
    return {"text": t.text, "kind": "contrast", "metric": t.metric, "expect": t.expect, "ref": t.ref,
            "margin": margin, "weights": weights, "requires": list(t.requires),
            "selected": [str(n) for n, _ in t.weights if not isinstance(n, str)]}


def _candidates(claims: Sequence[Claim], arms: Dict[str, Arm]) -> set:
    return {m for c in claims for t in c.tests for n, _ in t.weights if not isinstance(n, str)
            for m in n.candidates(arms)}


def evaluate(report: Dict[str, Any]) -> None:
    """Fill in every test's estimate, interval, p-values (raw and Holm-adjusted) and verdict, and every
    claim's verdict, from the report's own per-seed values (in place); a report with a plan (v3) by its
    primary hypotheses (:mod:`.primary`)."""
    if report.get("plan"):
        return evaluate_v3(report)
    values, family = report["values"], []
    for c in report["claims"]:
        seen: Dict[Any, str] = {}
        for t in c["tests"]:
            if t.get("kind") == "correlation":
                t["p_values"] = {} if t.get("p") is None else {"effect": t["p"]}
            elif "error" not in t:
                fill_contrast(t, values, report)
                key = (t["metric"], tuple(sorted((a, abs(w)) for a, w in t["weights"])))
                if key in seen:  # e.g. claim 2 when both read-outs peak at the same rate
                    t["duplicate_of"], t["p_values"] = seen[key], {}
                seen.setdefault(key, t["text"])
            family += [(t, k, p) for k, p in (t.get("p_values") or {}).items()]
    adjusted = stats.holm([p for _, _, p in family])
    for t in (t for c in report["claims"] for t in c["tests"]):
        t["p_adjusted"] = {}
    for (t, k, _), p in zip(family, adjusted):
        t["p_adjusted"][k] = p
    report["tests_in_family"] = len(family)
    for c in report["claims"]:
        by_text = {}
        for t in c["tests"]:
            if t.get("kind") == "correlation":
                t["verdict"] = stats.decide_correlation(t.get("rho"), t["p_adjusted"].get("effect"))
            elif "error" in t:
                t["verdict"] = stats.UNDERPOWERED
            elif t.get("duplicate_of"):  # tested once, under the first text; not a claim's evidence twice
                t["verdict"] = stats.UNDERPOWERED
            else:
                t["verdict"] = stats.decide(t["expect"], t["estimate"], t["ref"], t["p_adjusted"])
                unmet = [r for r in t.get("requires", []) if by_text.get(r) != stats.REPRODUCED]
                if unmet:
                    t["verdict"] = stats.UNDERPOWERED
                    t["note"] = "not testable: " + "; ".join(unmet) + " is not reproduced"
            by_text[t["text"]] = t["verdict"]
        c["verdict"] = stats.combine([t["verdict"] for t in c["tests"] if not t.get("duplicate_of")])


def compute(measures: Dict[str, List[Dict[str, Any]]], *, wall_s: float, runs: Dict[str, int],
            jobs: int = 1) -> Dict[str, Any]:
    """What the report cost: the runs' summed training time (from their results.json, so it covers earlier
    invocations too), per run, and this invocation's wall time with what it did (``runs``: training /
    resumed / reused counts; empty for ``--report-only``); the machines and code versions that trained."""
    ms = [m for v in measures.values() for m in v]
    machines = Counter(m.get("machine") or "" for m in ms)  # "": measured before the machine was recorded
    codes = Counter(code_id(m.get("code")) for m in ms)
    backends = Counter(m.get("backend") or "unrecorded" for m in ms)
    per_run: Dict[str, Dict[str, float]] = {}
    for run, v in measures.items():
        per_run[run] = {str(m["seed"]): float(m.get("train_s") or 0.0) for m in v}
    return {"runs": len(ms), "train_s_total": sum(float(m.get("train_s") or 0.0) for m in ms),
            "train_s": per_run, "machines": dict(sorted(machines.items(), key=lambda kv: (-kv[1], kv[0]))),
            "code_versions": dict(sorted(codes.items(), key=lambda kv: (-kv[1], kv[0]))),
            "backends": dict(sorted(backends.items(), key=lambda kv: (-kv[1], kv[0]))),
            "wall_s": float(wall_s), "jobs": int(jobs), "this_invocation": {k: int(v) for k, v in sorted(runs.items())},
            "complete": bool(ms) and runs.get("training", 0) == len(ms)}


def _mean_matrix(mats: List[Optional[list]]) -> Optional[list]:
    mats = [m for m in mats if m]
    if not mats:
        return None
    import numpy as np

    return np.mean(np.asarray(mats, dtype=float), axis=0).tolist()


def write(report: Dict[str, Any], out: PathLike, claims: Sequence[Claim] = ()) -> Path:
    from .figures import curves_figure, figure
    from .markdown import markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report["curves_file"] = curves_figure(report, out / "curves.png") and "curves.png"
    figs: Dict[int, str] = {}
    for rec in report["claims"]:
        path = figure(rec, report, out / f"claim{rec['id']}.png")
        if path is not None:
            figs[rec["id"]] = path.name
        rec["figure_file"] = figs.get(rec["id"])
    write_json_atomic(out / "report.json", report)
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(markdown(report, figs))
    return out / "report.md"
