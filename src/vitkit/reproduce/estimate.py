"""What a budget costs, estimated from a finished report's measured training time.

Training cost is modelled as proportional to 3 x forward multiply-adds x images seen (forward and backward;
evaluations on the 5,000 validation images are forward only); the seconds per multiply-add are fitted to the
reference report's summed training time (a v1 report.json records the total only, so one rate serves every
arm; a v2 one records each run's time). With ``jobs`` runs at a time on as many cores, wall time is the sum
divided by ``jobs`` (the reference ran that way too); waits for a parent run or for the sweep, and each run's
start-up (a few seconds), are not counted.
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


def _macs(arm: Arm) -> int:
    from ..models.cost import cost
    from ..train import load_recipe

    r = load_recipe(arm.recipe, {"model": arm.full_model()} if arm.model is not None else {})
    return cost(r.model_config(num_classes=10, in_chans=1)).macs


def passes(arm: Arm, b: Budget) -> Tuple[float, float]:
    """(training images seen, images evaluated forward only) of one run of ``arm`` under ``b``: the
    evaluations include the validation curve, the final validation and test passes and the probes' features."""
    val = b.val_size or VAL_IMAGES
    pool = TRAIN_IMAGES + VAL_IMAGES - val  # the training split after the hold-out
    n = pool // 2 if arm.classes else pool
    n_main = min(n, b.train_images or n)
    final = val + (b.test_images or TEST_IMAGES) + val  # validation, test, and the probes' validation features
    if arm.length in ("main", "finetune"):
        epochs = b.epochs if arm.length == "main" else b.finetune_epochs
        return n_main * epochs, (val * int(epochs) if b.curves else 0) + final
    if arm.length == "data":
        return b.data_steps * BATCH, final
    if arm.length == "mpp":
        return pool * b.mpp_epochs, 0
    if arm.length == "few_labels":
        return b.few_labels * b.few_label_epochs, val * (10 if b.curves else 0) + final
    return 0.0, val  # an untrained model: measured only


def run_list(b: Budget) -> List[Tuple[Arm, int]]:
    """(arm, runs) of a whole campaign of ``b`` (every claim), the sweep included; each family's rate is
    taken as the first of the sweep (the cost does not depend on which wins)."""
    from . import plan, sweep

    _, arms, names = plan(None, b)
    fams = sweep.families(names, arms)
    points = sweep.sweep_arms(fams, arms, b)
    chosen = {f: {"lr": b.lr_sweep[0]} for f in fams}
    runs, alias = sweep.resolve(arms, chosen)
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


def seconds_per_mac(reference: PathLike) -> float:
    report = json.loads(Path(reference).read_text())
    runs = _v1_runs(report)
    if len(runs) != report["compute"]["runs"]:
        raise DataError(f"{reference}: {len(runs)} runs reconstructed, the report counts {report['compute']['runs']}")
    return report["compute"]["train_s_total"] / sum(3 * m * s for m, s in runs)


REFERENCE = "docs/reproduction/v1/report.json"  # the committed v1 report (93 runs of the v1 full budget)


def estimate(budget: Any, reference: PathLike, jobs: int = 2, rate: Optional[float] = None) -> Dict[str, Any]:
    """Runs, summed run time and wall time (hours) of a whole campaign of ``budget``."""
    b = get_budget(budget) if isinstance(budget, str) else budget
    rate = rate if rate is not None else seconds_per_mac(reference)
    total, n = 0.0, 0
    for arm, k in run_list(b):
        seen, evals = passes(arm, b)
        total += k * rate * _macs(arm) * (3 * seen + evals)
        n += k
    return {"budget": b.name, "runs": n, "run_hours": total / 3600, "wall_hours": total / 3600 / jobs,
            "wall_s": total / jobs, "jobs": jobs, "seconds_per_gmac": rate * 1e9}


def budgets_json(reference: PathLike, jobs: int = 2) -> Dict[str, Any]:
    """Both budgets' estimates (docs/reproduction/budgets.json: ``python -m vitkit.reproduce.estimate``)."""
    return {"reference": str(REFERENCE), "jobs": jobs,
            "budgets": {name: {k: (float(f"{v:.4g}") if isinstance(v, float) else v)
                               for k, v in estimate(name, reference, jobs).items()} for name in ("quick", "full")}}


if __name__ == "__main__":
    import sys

    print(json.dumps(budgets_json(sys.argv[1] if len(sys.argv) > 1 else REFERENCE), indent=1))
