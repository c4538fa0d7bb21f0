"""report.json and report.md (with one PNG per claim) from the measured runs."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..utils import PathLike, atomic_path, write_json_atomic
from . import stats
from .budget import Budget
from .claims import METRIC_LABELS, SPEED, Arm, Claim

# The training logs' images / s stay in measures.json, out of the tables: runs of one report may have trained with
# different thread counts (--jobs), days or machines; speed comparisons read the side-by-side timing (SPEED).
SHOWN = ("test_top1", "val_top1", "fewshot_5", "fewshot_10", SPEED)
PERCENT = {"test_top1", "val_top1", "fewshot_5", "fewshot_10"}


def _values(measures: Dict[str, List[Dict[str, Any]]], metric: str) -> Dict[str, List[float]]:
    return {arm: [m[metric] for m in ms if m.get(metric) is not None] for arm, ms in measures.items()}


def _groups(arms: Dict[str, Arm]) -> Dict[str, List[Tuple[float, str]]]:
    out: Dict[str, List[Tuple[float, str]]] = {}
    for a in arms.values():
        if a.group:
            out.setdefault(a.group, []).append((a.x, a.name))
    return {g: sorted(v) for g, v in out.items()}


def build(claims: Sequence[Claim], arms: Dict[str, Arm], measures: Dict[str, List[Dict[str, Any]]],
          canonical: Dict[str, str], budget: Budget, *, command: str = "", machine: str = "",
          all_names: Sequence[str] = (), speeds: Optional[Dict[str, List[float]]] = None) -> Dict[str, Any]:
    """The report as a JSON-ready dict. ``measures`` is keyed by canonical arm; ``canonical`` maps every
    arm name to its run's; ``speeds`` holds the side-by-side training speeds (one value per round) of the
    arms that speed comparisons read."""
    by_name = {n: measures.get(canonical.get(n, n), []) for n in arms}
    speeds = speeds or {}

    def values(metric: str) -> Dict[str, List[float]]:
        return {n: list(speeds.get(n, [])) for n in arms} if metric == SPEED else _values(by_name, metric)

    groups = _groups(arms)
    val = _values(by_name, "val_top1")
    out: Dict[str, Any] = {"command": command, "machine": machine, "budget": budget.name, "budget_note": budget.note,
                           "seeds": list(budget.seeds), "rule": stats.RULE, "data": budget.data_note,
                           "validation": (f"{budget.val_size:,} images held out of the training split" if budget.val_size
                                          else "the recipes' 5,000 training images, 500 per class, the same for "
                                               "every seed"), "claims": []}
    for c in claims:
        rec: Dict[str, Any] = {"id": c.id, "title": c.title, "paper": c.paper, "setup": c.setup, "limits": c.limits,
                               "metric": c.metric, "arms": [], "tests": []}
        for name in c.arms:
            a = arms[name]
            row: Dict[str, Any] = {"arm": name, "label": a.label or name, "run": canonical.get(name, name),
                                   "group": a.group, "x": a.x}
            ms = by_name[name]
            if ms:
                row["params"], row["macs"] = ms[0]["params"], ms[0]["macs"]
            for metric in SHOWN + (c.metric,):
                row[metric] = stats.summary(speeds.get(name, []) if metric == SPEED else [m.get(metric) for m in ms])
            if name in speeds and any(t.metric == SPEED for t in c.tests):
                row["rounds"] = list(speeds[name])  # the side-by-side timing, one rate per round
            if c.figure == "distance":
                row["distance"] = _mean_matrix([m.get("distance") for m in ms])
                row["uniform_distance"] = ms[0].get("uniform_distance") if ms else None
            rec["arms"].append(row)
        verdicts = []
        for t in c.tests:
            metric_vals = values(t.metric)
            try:
                weights = [(stats.resolve(n, groups, val), w) for n, w in t.weights]
            except ValueError as err:
                rec["tests"].append({"text": t.text, "error": str(err), "verdict": "inconclusive"})
                verdicts.append("inconclusive")
                continue
            cst = stats.contrast(weights, metric_vals, paired=t.metric == SPEED)
            margin = stats.MARGIN if t.metric in PERCENT else float("inf")
            v = stats.verdict(cst["estimate"], cst["se"], t.expect, t.ref, margin)
            rec["tests"].append({"text": t.text, "metric": t.metric, "expect": t.expect, "ref": t.ref,
                                 "weights": weights, **cst, "verdict": v})
            verdicts.append(v)
        if c.id == 10:
            names = [n for n in all_names if arms[n].kind == "train" and by_name.get(n)]
            pts = [(n, stats.summary(_values(by_name, "fewshot_5")[n])["mean"],
                    stats.summary(_values(by_name, "test_top1")[n])["mean"]) for n in names]
            rc = stats.rank_correlation([p[1] for p in pts], [p[2] for p in pts])
            rec["points"] = [{"arm": n, "label": arms[n].label or n, "fewshot_5": f, "test_top1": t}
                             for n, f, t in pts]
            rec["tests"].append({"text": "Spearman rank correlation of 5-shot and test accuracy over models",
                                 **rc})
            verdicts.append(rc["verdict"])
        rec["verdict"] = stats.combine(verdicts)
        out["claims"].append(rec)
    return out


def compute(measures: Dict[str, List[Dict[str, Any]]], *, wall_s: float, runs: Dict[str, int],
            jobs: int = 1) -> Dict[str, Any]:
    """What the report cost: the runs' summed training time (from their results.json, so it covers earlier
    invocations too) and this invocation's wall time with what it did (``runs``: training / resumed / reused
    counts; empty for ``--report-only``). The wall time is the whole cost only when every run was trained
    from scratch by this invocation. ``jobs``: runs trained at once (each its own process)."""
    ms = [m for v in measures.values() for m in v]
    machines = Counter(m.get("machine") or "" for m in ms)  # "": measured before the machine was recorded
    return {"runs": len(ms), "train_s_total": sum(float(m.get("train_s") or 0.0) for m in ms),
            "machines": dict(sorted(machines.items(), key=lambda kv: (-kv[1], kv[0]))),
            "wall_s": float(wall_s), "jobs": int(jobs), "this_invocation": {k: int(v) for k, v in sorted(runs.items())},
            "complete": bool(ms) and runs.get("training", 0) == len(ms)}


def _compute_line(c: Optional[Dict[str, Any]]) -> str:
    if not c:
        return ""
    did = c["this_invocation"]
    what = ", ".join(f"{n} {k}" for k, n in did.items()) if did else "report only, nothing trained"
    wall = (f"this command took {c['wall_s'] / 60:.1f} min wall for all of it" if c["complete"] else
            f"this invocation took {c['wall_s'] / 60:.1f} min wall ({what})")
    if c.get("jobs", 1) > 1:
        wall += f", {c['jobs']} runs at a time"
    line = f"Compute: {c['runs']} runs, {c['train_s_total'] / 60:.1f} min of training in all; {wall}."
    machines = c.get("machines") or {}
    known = [f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in machines.items() if m]
    if known:
        line += " Trained on: " + "; ".join(known) + "."
    if machines.get(""):
        line += f" Not recorded for {machines['']} run{'s' if machines[''] > 1 else ''} (measured before vitkit recorded it)."
    return line


def _mean_matrix(mats: List[Optional[list]]) -> Optional[list]:
    mats = [m for m in mats if m]
    if not mats:
        return None
    import numpy as np

    return np.mean(np.asarray(mats, dtype=float), axis=0).tolist()


# --- figures ---------------------------------------------------------------------------------------------
def figure(rec: Dict[str, Any], path: Path) -> Optional[Path]:
    from ..analysis.plots import matplotlib_figure, save_figure

    _, Figure = matplotlib_figure()
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    metric = rec["metric"]
    scale = 100.0 if metric in PERCENT else 1.0
    kind = rec.get("figure", "bars")
    if rec["id"] == 10:
        pts = [p for p in rec.get("points", []) if p["fewshot_5"] is not None and p["test_top1"] is not None]
        if not pts:
            return None
        ax.scatter([100 * p["fewshot_5"] for p in pts], [100 * p["test_top1"] for p in pts], s=14)
        for p in pts:
            ax.annotate(p["label"], (100 * p["fewshot_5"], 100 * p["test_top1"]), fontsize=6, alpha=0.7)
        ax.set(xlabel="5-shot linear accuracy (%)", ylabel="test top-1 (%)")
    elif kind == "distance":
        drew = False
        for i, row in enumerate(rec["arms"]):
            d = row.get("distance")
            if not d:
                continue
            drew = True
            for layer, heads in enumerate(d):
                ax.scatter([layer + 0.15 * i] * len(heads), heads, s=12, color=f"C{i}",
                           label=row["label"] if layer == 0 else None)
            if row.get("uniform_distance"):
                ax.axhline(row["uniform_distance"], color=f"C{i}", ls=":", lw=0.8,
                           label=f"{row['label']}: uniform attention")
        if not drew:
            return None
        depth = max(len(row.get("distance") or []) for row in rec["arms"])
        ax.set_xticks(range(depth))
        ax.set(xlabel="layer (one dot per head)", ylabel="mean attention distance (pixels)")
        ax.legend(fontsize=7)
    elif kind == "lines":
        groups: Dict[str, List[Dict[str, Any]]] = {}
        for row in rec["arms"]:
            groups.setdefault(row["group"], []).append(row)
        for g, rows in groups.items():
            rows = [r for r in rows if r[metric]["mean"] is not None]
            rows.sort(key=lambda r: r["x"])
            if not rows:
                continue
            ax.errorbar([r["x"] for r in rows], [scale * r[metric]["mean"] for r in rows],
                        yerr=[scale * (r[metric]["std"] or 0.0) for r in rows], marker="o", capsize=3, label=g)
        ax.set_xscale("log")
        ax.set(xlabel="learning rate" if rec["id"] == 2 else "labelled training images",
               ylabel=METRIC_LABELS.get(metric, metric) + (" (%)" if scale == 100 else ""))
        ax.legend(fontsize=8)
    else:
        rows = [r for r in rec["arms"] if r[metric]["mean"] is not None]
        if not rows:
            return None
        ax.bar(range(len(rows)), [scale * r[metric]["mean"] for r in rows],
               yerr=[scale * (r[metric]["std"] or 0.0) for r in rows], capsize=3, color="C0", alpha=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["label"] for r in rows], rotation=25, ha="right", fontsize=7)
        if scale == 100:  # accuracies: zoom onto the range the arms span
            lo = min(scale * r[metric]["mean"] for r in rows)
            hi = max(scale * r[metric]["mean"] for r in rows)
            ax.set_ylim(max(0.0, lo - max(2.0, 0.5 * (hi - lo))), min(100.0, hi + max(1.0, 0.3 * (hi - lo))))
        ax.set_ylabel(METRIC_LABELS.get(metric, metric) + (" (%)" if scale == 100 else ""))
    ax.set_title(f"Claim {rec['id']}: {rec['title']}", fontsize=9)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return path


# --- markdown --------------------------------------------------------------------------------------------
def _fmt(s: Dict[str, Any], metric: str) -> str:
    if not s or s.get("mean") is None:
        return "-"
    if metric in PERCENT:
        txt = f"{100 * s['mean']:.2f}"
        return txt + (f" ± {100 * s['std']:.2f}" if s.get("std") is not None else "")
    if metric == SPEED:  # images per second: whole numbers
        return f"{s['mean']:,.0f}" + (f" ± {s['std']:,.0f}" if s.get("std") is not None else "")
    txt = f"{s['mean']:.3g}"
    return txt + (f" ± {s['std']:.2g}" if s.get("std") is not None else "")


def _num(v: Optional[float], metric: str) -> str:
    if v is None:
        return "-"
    if metric == SPEED:
        return f"{v:+,.1f}"
    return f"{100 * v:+.2f} pt" if metric in PERCENT else f"{v:+.3g}"


def markdown(report: Dict[str, Any], figures: Dict[int, str]) -> str:
    lines = ["# vitkit reproduce: the paper's claims at laptop scale", "",
             f"Command: `{report['command']}`  ", f"{report['machine'][:1].upper()}{report['machine'][1:]}  ",
             f"Budget: **{report['budget']}**: {report['budget_note']}.  ",
             _compute_line(report.get("compute")), "",
             f"Data: {report['data']}. The validation split ({report['validation']}) chooses everything that is "
             "chosen (claim 2's learning rate, raw or EMA weights) and is what the probes read (few-shot accuracy, "
             "attention statistics); the test split is read once per final model, by the trainer, with the "
             "exported weights. Accuracies are in %, as mean ± standard deviation over seeds.", "",
             f"**Verdict rule.** {report['rule']}", "", "| claim | verdict |", "|---|---|"]
    for c in report["claims"]:
        lines.append(f"| {c['id']}. {c['title']} | {c['verdict']} |")
    for c in report["claims"]:
        lines += ["", f"## Claim {c['id']}: {c['title']}", "", f"**Paper.** {c['paper']}", "",
                  f"**Our set-up.** {c['setup']}", ""]
        if c["arms"]:
            metrics = [m for m in SHOWN if any(r[m]["mean"] is not None for r in c["arms"])]
            if c["metric"] not in metrics and any(r[c["metric"]]["mean"] is not None for r in c["arms"]):
                metrics.append(c["metric"])
            lines.append("| arm | run | params | MACs | " + " | ".join(METRIC_LABELS.get(m, m) for m in metrics)
                         + " | seeds |")
            lines.append("|---" * (5 + len(metrics)) + "|")
            for r in c["arms"]:
                n = max((r[m]["n"] for m in metrics if m != SPEED), default=0)  # speed: rounds, not seeds
                lines.append(f"| {r['label']} | {r['run']} | {r.get('params', '-'):,} | "
                             f"{(r.get('macs') or 0) / 1e6:.2f} M | "
                             + " | ".join(_fmt(r[m], m) for m in metrics) + f" | {n} |"
                             if r.get("params") else
                             f"| {r['label']} | {r['run']} | - | - | " + " | ".join("-" for _ in metrics) + " | 0 |")
        if c["id"] in figures:
            lines += ["", f"![claim {c['id']}]({figures[c['id']]})"]
        lines += ["", "| comparison | estimate | 2 SE | verdict |", "|---|---|---|---|"]
        for t in c["tests"]:
            if "rho" in t:
                est = "-" if t["rho"] is None else f"rho = {t['rho']:.2f} (p = {t['p']:.3g}, {t['n']} models)"
                lines.append(f"| {t['text']} | {est} | - | {t['verdict']} |")
                continue
            if "error" in t:
                lines.append(f"| {t['text']} | {t['error']} | - | {t['verdict']} |")
                continue
            m = t["metric"]
            resolved = " ".join(f"{'+' if w > 0 else '-'} {a}" for a, w in t["weights"])
            two_se = None if t["se"] is None else 2 * t["se"]
            ref = f" vs {t['ref']:g}" if t["ref"] else ""
            lines.append(f"| {t['text']} ({METRIC_LABELS.get(m, m)}: {resolved}{ref}) | {_num(t['estimate'], m)} | "
                         f"{'-' if two_se is None else _num(two_se, m).lstrip('+')} | {t['verdict']} |")
        lines += ["", f"**Verdict: {c['verdict']}.**" + (f" At this scale: {c['limits']}" if c["limits"] else "")]
    return "\n".join(lines) + "\n"


def write(report: Dict[str, Any], out: PathLike, claims: Sequence[Claim]) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs: Dict[int, str] = {}
    kinds = {c.id: c.figure for c in claims}
    for rec in report["claims"]:
        rec["figure"] = kinds.get(rec["id"], "bars")
        path = figure(rec, out / f"claim{rec['id']}.png")
        if path is not None:
            figs[rec["id"]] = path.name
        rec["figure_file"] = figs.get(rec["id"])
    write_json_atomic(out / "report.json", report)
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(markdown(report, figs))
    return out / "report.md"
