"""Claim-specific analyses, declared with their claim (:attr:`vitkit.reproduce.claims.Claim.analysis`).

An analysis takes the claim and the per-seed values of every arm (``{arm: {metric: {seed: value}}}``) and
returns the claim's extra records: ``points`` for its figure and ``tests`` (each with a ``p`` that joins the
report's Holm family and a ``kind`` the report knows how to decide).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from . import stats


def _mean(per_seed: Mapping[int, float]):
    return stats.summary(list(per_seed.values()))["mean"] if per_seed else None


def transfer_correlation(claim, values: Mapping[str, Mapping[str, Mapping[int, float]]]) -> Dict[str, Any]:
    """Claim 10: per model, the 5-shot linear accuracy of its frozen features on the held-out classes (arm
    ``xfer-M``, pre-trained on the other classes) against the test accuracy after fine-tuning on them (arm
    ``xfer-ft-M``); Spearman's rank correlation over the models' seed means."""
    points = []
    for name in claim.arms:
        if not name.startswith("xfer-") or name.startswith("xfer-ft-"):
            continue
        model = name[len("xfer-"):]
        few = _mean((values.get(name) or {}).get("fewshot_5") or {})
        ft = _mean((values.get(f"xfer-ft-{model}") or {}).get("test_top1") or {})
        points.append({"arm": model, "label": model, "fewshot_5": few, "test_top1": ft})
    rc = stats.rank_correlation([p["fewshot_5"] for p in points], [p["test_top1"] for p in points])
    return {"points": points,
            "tests": [{"text": "Spearman rank correlation over models: 5-shot linear on unseen classes vs "
                               "fine-tuned test accuracy on them", "kind": "correlation", **rc},
                      {"text": SLOPE_TEXT, "kind": "slope", "metric": "slope", "expect": ">", "ref": 0.0,
                       "margin": None, "weights": [], "per_seed": transfer_slopes(claim.arms, values)}]}


SLOPE_TEXT = "slope of fine-tuned test accuracy on 5-shot linear accuracy across models (per seed)"


def transfer_slopes(arm_names, values: Mapping[str, Mapping[str, Mapping[int, float]]]) -> Dict[str, float]:
    """Claim 10's per-seed value: the least-squares slope of fine-tuned test accuracy (``xfer-ft-M``) on 5-shot
    linear accuracy (``xfer-M``) over the transfer models M, at each seed every model has both (at least 3
    models; a seed whose 5-shot accuracies are all equal has no slope)."""
    models = [n[len("xfer-"):] for n in arm_names if n.startswith("xfer-") and not n.startswith("xfer-ft-")]
    out: Dict[str, float] = {}
    seeds = set.intersection(*[set((values.get(f"xfer-{m}") or {}).get("fewshot_5", {})) &
                               set((values.get(f"xfer-ft-{m}") or {}).get("test_top1", {})) for m in models]
                             ) if models else set()
    for s in sorted(seeds, key=int):
        xs = [float(values[f"xfer-{m}"]["fewshot_5"][s]) for m in models]
        ys = [float(values[f"xfer-ft-{m}"]["test_top1"][s]) for m in models]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        if len(xs) >= 3 and sxx > 0:
            out[str(s)] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return out
