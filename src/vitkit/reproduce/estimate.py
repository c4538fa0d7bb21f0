"""What a budget costs, estimated from a finished report's measured training time.

Training cost is modelled as proportional to 3 x forward multiply-adds x images seen (forward and backward;
evaluations on the 5,000 validation images are forward only); the seconds per multiply-add are fitted to the
reference report's summed training time. With ``jobs`` runs at a time on as many cores, wall time is the sum
divided by ``jobs`` (the reference ran that way too).

Two kinds of reference: the committed v1 report.json records the training total only (one rate serves every
arm; each run's start-up, probes and waits are not counted). A complete v2 report (one invocation that trained
every run, e.g. ``--budget quick`` on the machine in question) records each run's training time and the wall
time of the whole: the rate is fitted to the training times, and what the wall time holds beyond training and
the evaluations' forwards (start-up, probes, attention statistics, waits for a parent or for the sweep) is
charged as a fixed overhead per run. That is how a budget's cost on one machine kind is estimated from a
short run there.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import DataError
from ..utils import PathLike
from .budget import Budget, get_budget
from .claims import Arm

TRAIN_IMAGES, VAL_IMAGES, TEST_IMAGES, BATCH = 55000, 5000, 10000, 100  # Fashion-MNIST; fmnist-1k's batch


_MACS: Dict[str, int] = {}


def arm_macs(arm: Arm) -> int:
    """Forward multiply-adds of one image through the arm's model (10 classes, 1 channel), cached per model."""
    from ..models.cost import cost
    from ..train import load_recipe

    key = json.dumps([arm.recipe, arm.full_model()], sort_keys=True, default=str)
    if key not in _MACS:
        r = load_recipe(arm.recipe, {"model": arm.full_model()} if arm.model is not None else {})
        _MACS[key] = cost(r.model_config(num_classes=10, in_chans=1)).macs
    return _MACS[key]


def passes(arm: Arm, b: Budget) -> Tuple[float, float]:
    """(training images seen, images evaluated forward only) of one run of ``arm`` under ``b``: the
    evaluations include the validation curve, the final validation and test passes and the probes' features."""
    val = b.val_size or VAL_IMAGES
    pool = TRAIN_IMAGES + VAL_IMAGES - val  # the training split after the hold-out
    n = pool // 2 if arm.classes else pool
    n_main = min(n, b.train_images or n)
    final = val + (b.test_images or TEST_IMAGES) + val  # validation, test, and the probes' validation features
    k = arm.stretch
    curve = val * b.curve_points if b.version >= 3 else None  # v3: every classifying arm's curve
    if arm.length in ("main", "finetune"):
        epochs = b.epochs if arm.length == "main" else b.finetune_epochs
        return k * n_main * epochs, (curve if curve is not None else val * int(epochs) if b.curves else 0) + final
    if arm.length == "data":
        return k * b.data_steps * BATCH, (curve or 0) + final
    if arm.length == "mpp":
        return k * pool * b.mpp_epochs, curve or 0  # v3: its curve (on at most as many images)
    if arm.length == "few_labels":
        return k * b.few_labels * b.few_label_epochs, (curve if curve is not None else
                                                       val * (10 if b.curves else 0)) + final
    return 0.0, val  # an untrained model: measured only


def run_list(b: Budget) -> List[Tuple[Arm, int]]:
    """(arm, runs) of a whole campaign of ``b`` (every claim), the sweep included; each family's rate is
    taken as the first of the sweep (the cost does not depend on which wins)."""
    from . import sweep
    from .catalog import plan

    claims, arms, names = plan(None, b)
    if b.pilot:  # the pilot trains the arms of the primary hypotheses only
        from .rule import claim_arms, load_plan
        prereg = load_plan()
        wanted = {a for c in claims for a in claim_arms(c, arms, prereg)}
        names = [n for n in names if n in wanted]
    fams = sweep.families(names, arms)
    chosen = {f: {"lr": sweep.rates(arms[f], b)[0]} for f in fams}
    runs, alias = sweep.resolve(arms, chosen)
    points = sweep.sweep_arms(fams, arms, b, resolved=(runs, alias))
    main = list(dict.fromkeys(alias[n] for n in names))
    out = [(a, len(b.sweep_seeds)) for a in points.values()]
    for n in main:  # the sweep's runs at the chosen rate are reused
        out.append((runs[n], len(b.seeds) - (len(b.sweep_seeds) if n in points else 0)))
    return out


def _v1_runs(report: Dict[str, Any]) -> List[Tuple[int, float]]:
    """(MACs, images seen) of each run of a v1 report (the v1 full budget: 55k images x 10 epochs per main
    arm, 3 per fine-tune, 5,400 steps of 100 per data arm, MPP 2 epochs, 1k labels x 60 epochs)."""
    rows = {r["run"]: r["macs"] for c in report["claims"] for r in c["arms"] if r.get("macs")}
    rows["mpp"] = rows.get("few-scratch")
    seeds = len(report["seeds"])
    out = []
    for run, macs in rows.items():
        seen = (5400 * BATCH if run.startswith("data-") else 60000 if run.startswith("few-") else
                2 * TRAIN_IMAGES if run == "mpp" else 3 * TRAIN_IMAGES if run.startswith("res-ft") else
                10 * TRAIN_IMAGES)
        out += [(macs, seen)] * seeds
    return out


def _run_arms(b: Budget) -> Dict[str, Arm]:
    """Every run name a campaign of ``b`` can have (each arm at every rate of its family's starting grid) ->
    its arm; a name outside it (a grown grid, a stretched schedule) is read by :func:`arm_of`."""
    from .catalog import plan
    from .sweep import rates

    _, arms, _ = plan(None, b)
    out: Dict[str, Arm] = {}
    for a in arms.values():
        out[a.name] = a
        for lr in set(b.lr_sweep) | set(rates(arms.get(a.family, a), b)):
            out.setdefault(a.at_lr(lr).name, a.at_lr(lr))
    return out


def arm_of(run: str, known: Dict[str, Arm]) -> Optional[Arm]:
    """The arm of a run name ``ARM@lrX`` or ``ARM@lrX-xS`` (S: its schedule's stretch), ``ARM@xS`` (a fixed-rate
    arm's stretched schedule), or None."""
    import re

    if run in known:
        return known[run]
    base, _, tag = run.partition("@")
    x = re.fullmatch(r"x([0-9.]+)", tag)
    if x is not None and base in known and known[base].lr is not None:
        return known[base].at(float(known[base].lr), float(x.group(1)))
    m = re.fullmatch(r"lr([0-9.]+e-?[0-9]+)(?:-x([0-9.]+))?", tag)
    if base not in known or m is None:
        return None
    return known[base].at_lr(float(m.group(1)), float(m.group(2) or 1))


def is_v2(report: Dict[str, Any]) -> bool:
    return isinstance(report.get("compute", {}).get("train_s"), dict)


def fit(report: Dict[str, Any], where: str = "report") -> Tuple[float, float]:
    """(seconds per multiply-add, overhead seconds per run) of a complete v2 report: the rate from its runs'
    training times, the overhead from its wall time x jobs less the training and evaluation it accounts for."""
    c = report["compute"]
    if not c.get("complete"):
        raise DataError(f"{where}: not one invocation that trained every run (compute.complete is false), so its "
                        f"wall time does not cover the campaign; fit to a run of a whole budget")
    b = get_budget(report["budget"], int(report.get("version", 2)))
    known = _run_arms(b)
    arms = {r: a for r in c["train_s"] for a in [arm_of(r, known)] if a is not None}
    unknown = sorted(set(c["train_s"]) - set(arms))
    if unknown:
        raise DataError(f"{where}: run {unknown[0]} is not a run of budget {b.name} in this code version")
    train_s = work = evals = 0.0
    n = 0
    for run, seeds in c["train_s"].items():
        seen, ev = passes(arms[run], b)
        for s in seeds.values():
            train_s += float(s)
            work += 3 * arm_macs(arms[run]) * seen
            evals += arm_macs(arms[run]) * ev
            n += 1
    if work <= 0 or train_s <= 0:
        raise DataError(f"{where}: no training time recorded")
    rate = train_s / work
    overhead = (float(c["wall_s"]) * int(c["jobs"]) - train_s - rate * evals) / n
    return rate, max(0.0, overhead)


def rates(reference: PathLike) -> Tuple[float, float]:
    """(seconds per multiply-add, overhead seconds per run) fitted to ``reference`` (v1: no overhead)."""
    report = json.loads(Path(reference).read_text())
    return fit(report, str(reference)) if is_v2(report) else (_v1_rate(report, reference), 0.0)


def seconds_per_mac(reference: PathLike) -> float:
    return rates(reference)[0]


def _v1_rate(report: Dict[str, Any], reference: PathLike) -> float:
    runs = _v1_runs(report)
    if len(runs) != report["compute"]["runs"]:
        raise DataError(f"{reference}: {len(runs)} runs reconstructed, the report counts {report['compute']['runs']}")
    return report["compute"]["train_s_total"] / sum(3 * m * s for m, s in runs)


REFERENCE = "docs/reproduction/v1/report.json"  # the committed v1 report (93 runs of the v1 full budget)


def estimate(budget: Any, reference: PathLike, jobs: int = 2, rate: Optional[float] = None,
             overhead_s: Optional[float] = None, version: int = 3) -> Dict[str, Any]:
    """Runs, summed run time and wall time (hours) of a whole campaign of ``budget`` (a name: of ``version``'s
    budgets) at its minimum seeds; the rate (and, from a v2 reference, the per-run overhead) fitted to
    ``reference`` unless given."""
    b = get_budget(budget, version) if isinstance(budget, str) else budget
    if rate is None:
        rate, fitted = rates(reference)
        overhead_s = fitted if overhead_s is None else overhead_s
    overhead_s = overhead_s or 0.0
    total, n = 0.0, 0
    for arm, k in run_list(b):
        seen, evals = passes(arm, b)
        total += k * (rate * arm_macs(arm) * (3 * seen + evals) + overhead_s)
        n += k
    return {"budget": b.name, "runs": n, "run_hours": total / 3600, "wall_hours": total / 3600 / jobs,
            "wall_s": total / jobs, "jobs": jobs, "seconds_per_gmac": rate * 1e9, "overhead_s_per_run": overhead_s}


def budgets_json(reference: PathLike = REFERENCE, jobs: int = 2, name: Optional[str] = None,
                 version: int = 2) -> Dict[str, Any]:
    """Both budgets' estimates (docs/reproduction/budgets.json: ``python -m vitkit.reproduce.estimate``; the v2
    budgets unless ``version`` says otherwise), with the reference's machine, and for a v2 reference its
    measured wall time beside the estimate."""
    report = json.loads(Path(reference).read_text())
    out: Dict[str, Any] = {"reference": str(name or REFERENCE), "jobs": jobs}
    machines = report.get("compute", {}).get("machines") or {}
    out["machine"] = (next(iter(machines)) if machines else "") or report.get("machine", "")
    if is_v2(report):
        out["measured"] = {"budget": report["budget"], "wall_s": float(f"{report['compute']['wall_s']:.4g}"),
                           "runs": report["compute"]["runs"], "jobs": report["compute"]["jobs"]}
    rate, overhead = rates(reference)  # fitted once for both budgets
    out["budgets"] = {b: {k: (float(f"{v:.4g}") if isinstance(v, float) else v)
                          for k, v in estimate(b, reference, jobs, rate, overhead, version).items()}
                      for b in ("quick", "full")}
    return out


if __name__ == "__main__":
    import sys

    ref = sys.argv[1] if len(sys.argv) > 1 else REFERENCE
    print(json.dumps(budgets_json(ref, name=ref), indent=1))
