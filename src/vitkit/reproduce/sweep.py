"""The learning rate of every arm that does not fix one, chosen on the validation split.

Arms form families (:attr:`Arm.family`: the arm itself, or the arm whose sweep it shares, e.g. the
position-embedding variants share the base ViT's). Each family's arm is trained at every rate of the
budget's sweep at the sweep seeds; the rate with the best mean validation accuracy (ties: the smaller rate)
is the family's. An arm at its chosen rate is an ordinary fixed-rate arm named ``ARM@lrX``, so the sweep's
run at the chosen rate is reused as that arm's run at the sweep seed.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from .budget import Budget
from .claims import Arm, parents_first, same_run


def families(names: Sequence[str], arms: Mapping[str, Arm], fixed: bool = False) -> List[str]:
    """The families whose sweep the arms need, a family after the family of its parent (a fine-tune's sweep
    starts from its parent at the parent's chosen rate and schedule). ``fixed`` (v3): every arm of a fixed rate
    that trains (:attr:`Arm.grows`: claim 2's read-outs, the MPP parent) is a family too, of its one rate,
    whose schedule :func:`grow` lengthens by the same convergence rule."""
    out: List[str] = []

    def swept(a: Arm) -> bool:
        return a.lr is None or (fixed and a.grows)

    def add(f: str, n: str) -> None:
        if f in out:
            return
        fam = arms.get(f)
        if fam is None:
            raise ConfigError(f"arm {n}: its sweep family {f!r} is not an arm")
        if fam.parent and swept(arms[fam.parent]):
            add(arms[fam.parent].family, f)
        out.append(f)
    for n in names:
        if swept(arms[n]):
            add(arms[n].family, n)
    return out


def rates(fam: Arm, budget: Budget) -> List[float]:
    """A family's starting grid: the budget's fine-tuning rates for a fine-tune (when it has them), else its
    pre-training rates; an arm of a fixed rate: that rate."""
    if fam.lr is not None:
        return [float(fam.lr)]
    grid = budget.finetune_lr_sweep if fam.length == "finetune" and budget.finetune_lr_sweep else budget.lr_sweep
    return sorted(grid)


def sweep_arms(fams: Sequence[str], arms: Mapping[str, Arm], budget: Budget,
               grids: Optional[Mapping[str, Sequence[float]]] = None, stretch: Optional[Mapping[str, float]] = None,
               resolved: Optional[Tuple[Dict[str, Arm], Dict[str, str]]] = None) -> Dict[str, Arm]:
    """Every sweep point as a fixed-rate arm, keyed by its run name (parents included): each family at every
    rate of its grid (default :func:`rates`) and its ``stretch``; a parent swept itself is its run
    (``resolved``: :func:`resolve` of the families chosen so far)."""
    runs, alias = resolved or ({}, {})
    if fams and not budget.lr_sweep:
        raise ConfigError(f"budget {budget.name} sweeps no learning rates but arms need one chosen")
    out: Dict[str, Arm] = {}
    for f in fams:
        fam = arms[f]
        if fam.parent:
            parent = alias.get(fam.parent, fam.parent)
            out[parent] = runs.get(parent) or arms[fam.parent]
            if out[parent].lr is None:
                raise ConfigError(f"family {f}: its parent {fam.parent} has no rate chosen yet")
            fam = replace(fam, parent=parent)
        for lr in (grids or {}).get(f) or rates(arms[f], budget):
            a = fam.at(lr, (stretch or {}).get(f, 1.0))
            out[a.name] = a
    return out


def choose(fams: Sequence[str], arms: Mapping[str, Arm], budget: Budget,
           val: Mapping[str, Sequence[float]], grids: Optional[Mapping[str, Sequence[float]]] = None,
           stretch: Optional[Mapping[str, float]] = None) -> Dict[str, Dict[str, object]]:
    """Per family: the chosen rate, the validation accuracy of every point (``val``: run name -> values over
    the sweep seeds) and ``edge``: ``"largest"`` or ``"smallest"`` where the chosen rate is the grid's end (the
    family's best rate may lie beyond the grid), else None (``"single"`` for a grid of one rate; a family of
    a fixed rate has no choice to make: ``fixed`` True, edge None, and it may measure no accuracy: the MPP
    parent)."""
    out: Dict[str, Dict[str, object]] = {}
    for f in fams:
        grid, k = sorted((grids or {}).get(f) or rates(arms[f], budget)), (stretch or {}).get(f, 1.0)
        points, fixed = [], arms[f].lr is not None
        for lr in grid:
            vals = list(val.get(arms[f].at(lr, k).name, []))
            if len(vals) != len(budget.sweep_seeds) or (None in vals and not fixed):
                raise ConfigError(f"sweep of {f} at lr {lr:g}: {len(vals)} of {len(budget.sweep_seeds)} seeds "
                                  f"measured")
            points.append((None if None in vals else sum(vals) / len(vals), -lr, lr, vals))
        best = points[0] if fixed else max(points)
        edge = (None if fixed else {grid[-1]: "largest", grid[0]: "smallest"}.get(best[2]) if len(grid) > 1
                else "single")
        out[f] = {"lr": best[2], "val_top1": {f"{p[2]:g}": p[3] for p in sorted(points, key=lambda p: p[2])},
                  "edge": edge, "grid": grid, "stretch": k, **({"fixed": True} if fixed else {})}
    return out


def grow(fams: Sequence[str], arms: Mapping[str, Arm], budget: Budget, train: Callable[..., Dict[str, Any]],
         converged: Callable[[Sequence[Mapping[str, Any]]], Optional[bool]]
         ) -> Tuple[Dict[str, Dict[str, object]], Dict[str, List[Dict[str, Any]]]]:
    """The v3 sweep: each family at every rate of its grid at the sweep seeds (``train(names, table, seeds)``
    -> measures per run); a best rate at an end of the grid grows the grid by a factor of 2 past that end (at
    most ``budget.grid_extensions`` times); a best point whose curves (its measures) have not ``converged``
    doubles the family's schedule and sweeps again (up to ``budget.max_stretch``). A fine-tune's family is
    swept after its parent's, from the parent's chosen run. Returns (per family its choice with ``grid``,
    ``stretch``, ``converged``, ``extended``; every sweep run's measures)."""
    chosen: Dict[str, Dict[str, object]] = {}
    measured: Dict[str, List[Dict[str, Any]]] = {}
    for stage in stages(fams, arms):
        grid = {f: rates(arms[f], budget) for f in stage}
        stretch, ext, todo = {f: 1.0 for f in stage}, {f: 0 for f in stage}, list(stage)
        while todo:
            table = sweep_arms(todo, arms, budget, grid, stretch, resolve(arms, chosen))
            twin = twins(table, arms)  # one run of two names (claim 2's GAP arm at 1e-3 is the base ViT's point)
            got = train([n for n in table if n not in twin], {n: a for n, a in table.items() if n not in twin},
                        budget.sweep_seeds)
            measured.update(got)
            got.update({n: got.get(t, []) for n, t in twin.items()})
            picks = choose(todo, arms, budget, {n: [m.get("val_top1") for m in ms] for n, ms in got.items()}, grid,
                           stretch)
            for f in list(todo):
                rec = picks[f]
                if rec["edge"] in ("largest", "smallest") and ext[f] < budget.grid_extensions:
                    grid[f] = sorted(grid[f] + [grid[f][-1] * 2 if rec["edge"] == "largest" else grid[f][0] / 2])
                    ext[f] += 1
                    continue
                ok = converged(got.get(arms[f].at(float(rec["lr"]), stretch[f]).name, []))
                if not ok and stretch[f] * 2 <= budget.max_stretch:
                    stretch[f] *= 2
                    continue
                chosen[f] = {**rec, "converged": ok, "extended": ext[f]}
                todo.remove(f)
    return chosen, measured


def twins(table: Mapping[str, Arm], arms: Mapping[str, Arm]) -> Dict[str, str]:
    """{point: the point it is the same run as} among ``table``'s points: the one whose arm comes first in the
    arm table is trained (as :func:`resolve` names the run), the other reads its measures."""
    order = {n: i for i, n in enumerate(arms)}
    names = sorted(table, key=lambda n: (order.get(n.split("@", 1)[0], len(order)), n))
    out: Dict[str, str] = {}
    for i, n in enumerate(names):
        t = next((m for m in names[:i] if m not in out and same_run(table[m], table[n])), None)
        if t is not None:
            out[n] = t
    return out


def stages(fams: Sequence[str], arms: Mapping[str, Arm]) -> List[List[str]]:
    """Families in rounds: a family whose parent's rate is swept comes in the round after its parent's."""
    depth: Dict[str, int] = {}
    for f in fams:  # (families() lists a parent's family first)
        p = arms[f].parent
        depth[f] = depth[arms[p].family] + 1 if p and arms[p].family in depth else 0
    return [[f for f in fams if depth[f] == d] for d in range(max(depth.values(), default=-1) + 1)]


def resolve(arms: Mapping[str, Arm], chosen: Mapping[str, Dict[str, object]]) -> Tuple[Dict[str, Arm], Dict[str, str]]:
    """(run arms keyed by run name, {arm name: run name}): every arm at its rate, parents renamed to their
    runs, and two arms of one configuration mapped to one run (the first in table order)."""
    fixed: Dict[str, Arm] = {}
    for name, a in arms.items():
        c = chosen.get(a.family)
        fixed[name] = a if c is None or (a.lr is not None and not c.get("fixed")) else \
            a.at(float(c["lr"]), float(c.get("stretch") or 1))
    runs: Dict[str, Arm] = {}
    alias: Dict[str, str] = {}
    for name in parents_first(arms):
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
