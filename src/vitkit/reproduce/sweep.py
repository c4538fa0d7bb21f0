"""The learning rate of every arm that does not fix one, chosen on the validation split.

Arms form families (:attr:`Arm.family`: the arm itself, or the arm whose sweep it shares, e.g. the
position-embedding variants share the base ViT's). Each family's arm is trained at every rate of the
budget's sweep at the sweep seeds; the rate with the best mean validation accuracy (ties: the smaller rate)
is the family's. An arm at its chosen rate is an ordinary fixed-rate arm named ``ARM@lrX``, so the sweep's
run at the chosen rate is reused as that arm's run at the sweep seed.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Mapping, Sequence, Tuple

from ..errors import ConfigError
from .budget import Budget
from .claims import Arm, same_run


def families(names: Sequence[str], arms: Mapping[str, Arm]) -> List[str]:
    """The families whose sweep the arms need, in first-use order."""
    out: List[str] = []
    for n in names:
        a = arms[n]
        if a.lr is None and a.family not in out:
            fam = arms.get(a.family)
            if fam is None:
                raise ConfigError(f"arm {n}: its sweep family {a.family!r} is not an arm")
            if fam.parent and arms[fam.parent].lr is None:
                raise ConfigError(f"family {a.family}: its parent {fam.parent} must have a fixed rate")
            out.append(a.family)
    return out


def sweep_arms(fams: Sequence[str], arms: Mapping[str, Arm], budget: Budget) -> Dict[str, Arm]:
    """Every sweep point as a fixed-rate arm, keyed by its run name (parents, fixed-rate, included)."""
    if fams and not budget.lr_sweep:
        raise ConfigError(f"budget {budget.name} sweeps no learning rates but arms need one chosen")
    out: Dict[str, Arm] = {}
    for f in fams:
        fam = arms[f]
        if fam.parent:
            out[fam.parent] = arms[fam.parent]
        for lr in budget.lr_sweep:
            a = fam.at_lr(lr)
            out[a.name] = a
    return out


def choose(fams: Sequence[str], arms: Mapping[str, Arm], budget: Budget,
           val: Mapping[str, Sequence[float]]) -> Dict[str, Dict[str, object]]:
    """Per family: the chosen rate, the validation accuracy of every point (``val``: run name -> values over
    the sweep seeds) and ``edge``: ``"largest"`` or ``"smallest"`` where the chosen rate is the grid's end (the
    family's best rate may lie beyond the grid), else None."""
    out: Dict[str, Dict[str, object]] = {}
    for f in fams:
        points = []
        for lr in budget.lr_sweep:
            vals = list(val.get(arms[f].at_lr(lr).name, []))
            if len(vals) != len(budget.sweep_seeds):
                raise ConfigError(f"sweep of {f} at lr {lr:g}: {len(vals)} of {len(budget.sweep_seeds)} seeds "
                                  f"measured")
            points.append((sum(vals) / len(vals), -lr, lr, vals))
        best = max(points)
        rates = sorted(budget.lr_sweep)
        edge = {rates[-1]: "largest", rates[0]: "smallest"}.get(best[2]) if len(rates) > 1 else None
        out[f] = {"lr": best[2], "val_top1": {f"{p[2]:g}": p[3] for p in sorted(points, key=lambda p: p[2])},
                  "edge": edge}
    return out


def resolve(arms: Mapping[str, Arm], chosen: Mapping[str, Dict[str, object]]) -> Tuple[Dict[str, Arm], Dict[str, str]]:
    """(run arms keyed by run name, {arm name: run name}): every arm at its rate, parents renamed to their
    runs, and two arms of one configuration mapped to one run (the first in table order)."""
    fixed: Dict[str, Arm] = {}
    for name, a in arms.items():
        fixed[name] = a if a.lr is not None else (a.at_lr(chosen[a.family]["lr"]) if a.family in chosen else a)
    runs: Dict[str, Arm] = {}
    alias: Dict[str, str] = {}
    for name in _parents_first(arms):
        a = fixed[name]
        if a.parent:
            a = replace(a, parent=alias[a.parent])
        same = next((r for r, b in runs.items() if same_run(a, b)), None)
        if same is None:
            runs[a.name] = a
            same = a.name
        elif a.analysis and not runs[same].analysis:
            runs[same] = replace(runs[same], analysis=True)
        alias[name] = same
    return runs, alias


def _parents_first(arms: Mapping[str, Arm]) -> List[str]:
    out: List[str] = []

    def add(n: str) -> None:
        if n not in out:
            if arms[n].parent:
                add(arms[n].parent)
            out.append(n)
    for n in arms:
        add(n)
    return out
