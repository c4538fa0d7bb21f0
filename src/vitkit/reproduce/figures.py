"""One PNG per claim from report.json's per-seed values: bars or lines with 95% intervals, accuracy against
training compute (Figure 5's axes), the claim-10 scatter, and claim 9's attention distances."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from . import stats
from .claims import METRIC_LABELS, PERCENT


def _stat(report: Dict[str, Any], arm: str, metric: str) -> Dict[str, Any]:
    return stats.summary(list(((report["values"].get(arm) or {}).get(metric) or {}).values()))


def _err(s: Dict[str, Any], scale: float) -> float:
    return 0.0 if not s.get("ci") else scale * (s["ci"][1] - s["mean"])


def figure(rec: Dict[str, Any], report: Dict[str, Any], path: Path) -> Optional[Path]:
    from ..analysis.plots import matplotlib_figure, save_figure

    _, Figure = matplotlib_figure()
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    metric, kind = rec["metric"], rec.get("figure", "bars")
    scale = 100.0 if metric in PERCENT else 1.0
    ylabel = METRIC_LABELS.get(metric, metric) + (" (%)" if scale == 100 else "")
    drew = {"scatter": _scatter, "distance": _distance, "lines": _lines, "compute": _compute}.get(kind, _bars)(
        ax, rec, report, metric, scale)
    if not drew:
        return None
    if kind not in ("scatter", "distance"):
        ax.set_ylabel(ylabel if kind != "compute" else "test top-1 (%)")
    ax.set_title(f"Claim {rec['id']}: {rec['title']}", fontsize=9)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return path


def _scatter(ax, rec, report, metric, scale) -> bool:
    pts = [p for p in rec.get("points", []) if p["fewshot_5"] is not None and p["test_top1"] is not None]
    if not pts:
        return False
    ax.scatter([100 * p["fewshot_5"] for p in pts], [100 * p["test_top1"] for p in pts], s=14)
    for p in pts:
        ax.annotate(p["label"], (100 * p["fewshot_5"], 100 * p["test_top1"]), fontsize=6, alpha=0.7)
    ax.set(xlabel="5-shot linear accuracy on unseen classes (%)", ylabel="fine-tuned test top-1 on them (%)")
    return True


def _distance(ax, rec, report, metric, scale) -> bool:
    rows = [r for r in rec["arms"] if r.get("distance")]
    for i, row in enumerate(rows):
        for layer, heads in enumerate(row["distance"]):
            ax.scatter([layer + 0.15 * i] * len(heads), heads, s=12, color=f"C{i}",
                       label=row["label"] if layer == 0 else None)
        if row.get("uniform_distance"):
            ax.axhline(row["uniform_distance"], color=f"C{i}", ls=":", lw=0.8,
                       label=f"{row['label']}: uniform attention")
    if not rows:
        return False
    ax.set_xticks(range(max(len(r["distance"]) for r in rows)))
    ax.set(xlabel="layer (one dot per head, seed mean)", ylabel="mean attention distance (pixels)")
    ax.legend(fontsize=7)
    return True


def _lines(ax, rec, report, metric, scale) -> bool:
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in rec["arms"]:
        groups.setdefault(row["group"], []).append(row)
    drew = False
    for g, rows in groups.items():
        pts = sorted(((r["x"], _stat(report, r["arm"], metric)) for r in rows), key=lambda p: p[0])
        pts = [(x, s) for x, s in pts if s["mean"] is not None]
        if pts:
            drew = True
            ax.errorbar([x for x, _ in pts], [scale * s["mean"] for _, s in pts], yerr=[_err(s, scale) for _, s in pts],
                        marker="o", capsize=3, label=g)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate" if rec["id"] == 2 else "labelled training images")
    ax.legend(fontsize=8)
    return drew


def _compute(ax, rec, report, metric, scale) -> bool:
    """Test accuracy against training compute (3 x forward multiply-adds x images seen), as Figure 5."""
    drew = False
    for i, row in enumerate(rec["arms"]):
        acc, cost = _stat(report, row["arm"], "test_top1"), _stat(report, row["arm"], "train_macs")
        if acc["mean"] is None or not cost["mean"]:
            continue
        drew = True
        ax.errorbar([cost["mean"]], [100 * acc["mean"]], yerr=[_err(acc, 100.0)], marker="o", capsize=3,
                    color=f"C{i}", label=row["label"])
    ax.set_xscale("log")
    ax.set_xlabel("training compute (multiply-adds, forward + backward)")
    ax.legend(fontsize=7)
    return drew


def _bars(ax, rec, report, metric, scale) -> bool:
    rows = [(r, _stat(report, r["arm"], metric)) for r in rec["arms"]]
    rows = [(r, s) for r, s in rows if s["mean"] is not None]
    if not rows:
        return False
    ax.bar(range(len(rows)), [scale * s["mean"] for _, s in rows], yerr=[_err(s, scale) for _, s in rows], capsize=3,
           color="C0", alpha=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"] for r, _ in rows], rotation=25, ha="right", fontsize=7)
    if scale == 100:  # accuracies: zoom onto the range the arms span
        lo, hi = min(scale * s["mean"] for _, s in rows), max(scale * s["mean"] for _, s in rows)
        ax.set_ylim(max(0.0, lo - max(2.0, 0.5 * (hi - lo))), min(100.0, hi + max(1.0, 0.3 * (hi - lo))))
    return True


def curves_figure(report: Dict[str, Any], path: Path) -> Optional[Path]:
    """The validation curve of every arm that has one (seed 0), one panel: do the arms stop improving?"""
    from ..analysis.plots import matplotlib_figure, save_figure

    rows = [(arm, c[min(c, key=int)]) for arm, c in sorted(report.get("curves", {}).items()) if c]
    if not rows:
        return None
    _, Figure = matplotlib_figure()
    fig = Figure(figsize=(7.2, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for i, (arm, curve) in enumerate(rows):
        end = curve[-1][0] or 1.0
        ax.plot([e / end for e, _ in curve], [100 * a for _, a in curve], lw=1, color=f"C{i % 10}",
                ls=("-", "--", ":")[i // 10 % 3], label=arm)
    ax.set(xlabel="share of the run's schedule", ylabel="validation top-1 (%)",
           title="Validation curves (first seed)")
    ax.legend(fontsize=5, ncol=3)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return path
