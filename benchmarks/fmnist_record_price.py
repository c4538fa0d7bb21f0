"""What the Fashion-MNIST record (benchmarks/fmnist_record.py) costs on this machine, measured before it runs:
the seconds per optimiser step of the teacher and of each student arm, from short runs of their recipes as
the record trains them, and from those the wall time of one seed with its share of the teacher's training
against the record's 3-hour budget.

    .venv/bin/python benchmarks/fmnist_record_price.py                         # ~5 minutes; price.json
    .venv/bin/python benchmarks/fmnist_record_price.py --set train.precision=fp32 --teacher-set train.precision=fp32

Each timing run is the recipe unchanged but for its length (``--warm`` + ``--steps`` steps, no warm-up
epochs, no periodic evaluation or checkpoint) and, for a student, its patch dropout held at one end of its
schedule: the recipe's rate (``schedule.patch_drop_end`` unset) and none (``model.patch_drop=0``). The
distilled arms learn from the teacher timing run's exported weights (untrained, but the same network, so
the same forward cost). The seconds per step are read from the run's own log (``metrics.jsonl``: training
time between the first logged step after ``--warm`` and the last).

The estimate of a whole run (an estimate, not a measurement: the record's ledgers measure): the recipe's
steps times the mean step cost over its patch-dropout schedule, which holds the rate until
``schedule.patch_drop_from`` and then moves it linearly to ``patch_drop_end``; the step cost is taken as
linear in the rate between the two measured ends. Validation passes, checkpoints and the exported model's
test pass are not in it (the record's recipes validate every 2 or 5 epochs).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import fmnist_record as record
from vitkit.bench.machine import machine_info
from vitkit.cli._util import parse_overrides
from vitkit.train import load_recipe, train
from vitkit.train.runlog import read_metrics
from vitkit.utils import write_json_atomic
from vitkit.version import code_version

TIMING = {"schedule.warmup_epochs": 0.0, "schedule.warmup_steps": 1, "train.eval_every": 0, "train.ckpt_every": 0,
          "train.predictions": 0, "data.eval_split": None}
HELD = {"on": {"schedule.patch_drop_end": None}, "off": {"model.patch_drop": 0.0}}  # the schedule's two ends


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    command = "python benchmarks/fmnist_record_price.py " + " ".join(sys.argv[1:] if argv is None else argv)
    length = {**TIMING, "schedule.steps": args.warm + args.steps, "train.log_every": max(1, args.steps // 8)}
    teacher_set, student_set = record.run_overrides(args)  # as the record trains them
    with tempfile.TemporaryDirectory(prefix="fmnist-price-") as tmp:
        timed = {"teacher": time_steps(record.TEACHER, {**teacher_set, **length}, Path(tmp, "teacher"), args.warm)}
        student_set["distill.teacher"] = str(Path(tmp, "teacher", "model"))
        for arm, extra in record.MAIN_ARMS.items():
            for end, held in HELD.items():
                timed[f"{arm}-{end}"] = time_steps(args.recipe, {**student_set, **extra, **held, **length},
                                                   Path(tmp, f"{arm}-{end}"), args.warm)
    spe = timed["teacher"]["steps_per_epoch"]
    teacher = run_cost(load_recipe(record.TEACHER, teacher_set), spe, timed["teacher"]["s_per_step"])
    arms = {arm: run_cost(load_recipe(args.recipe, {**student_set, **extra}), spe,
                          timed[f"{arm}-on"]["s_per_step"], timed[f"{arm}-off"]["s_per_step"])
            for arm, extra in record.MAIN_ARMS.items()}
    share = teacher["estimate_s"] / args.seeds
    seed_s = arms["distill"]["estimate_s"] + share
    out = {"command": command, "recipe": args.recipe, "machine": machine_info(), "code": code_version(),
           "smoke": args.smoke,
           "overrides": {"student": parse_overrides(args.set), "teacher": parse_overrides(args.teacher_set)},
           "timing_steps": args.steps, "warm_steps": args.warm, "timed": timed,
           "teacher": teacher, "arms": arms, "seeds": args.seeds, "teacher_share_s": round(share, 1),
           "seed_estimate_s": round(seed_s, 1), "seed_estimate_h": round(seed_s / 3600, 2), "budget_s": record.BUDGET_S,
           "seed_fraction_of_budget": round(seed_s / record.BUDGET_S, 3),
           "record_estimate_h": round((teacher["estimate_s"] + args.seeds * sum(a["estimate_s"] for a in arms.values()))
                                      / 3600, 2),
           "excludes": "validation passes, checkpoints, the exported models' test passes"}
    path = Path(args.out) if args.out else record.FIGURES / args.recipe / "price.json"
    write_json_atomic(path, out)
    for name, t in timed.items():
        print(f"{name:12s} {t['s_per_step']:.4f} s/step")
    print(f"a seed with 1/{args.seeds} of the teacher: about {seed_s / 3600:.2f} h of the "
          f"{record.BUDGET_S / 3600:.0f}-hour budget (an estimate, validation passes excluded); {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=record.STUDENT, help=f"the students' recipe (default {record.STUDENT})")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    ap.add_argument("--warm", type=int, default=20, help="steps run before the timing starts (default 20)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds sharing the one teacher (default 3)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="every student run")
    ap.add_argument("--teacher-set", action="append", default=[], metavar="KEY=VALUE", help="the teacher run")
    ap.add_argument("--data", help="data.dataset of every run (default the recipes': fashion-mnist)")
    ap.add_argument("--out", help="the JSON file (default docs/figures/training/RECIPE/price.json)")
    ap.add_argument("--smoke", action="store_true", help="the record's tiny models (a test of the pipeline)")
    return ap


def time_steps(recipe_name: str, overrides: Dict[str, Any], folder: Path, warm: int) -> Dict[str, Any]:
    """Seconds per step of a short run of ``recipe_name``: training time (the log's ``time``) between the
    first logged step at or after ``warm`` and the last."""
    train(load_recipe(recipe_name, overrides), folder, progress=False)
    rows = [r for r in read_metrics(folder) if r.get("kind") == "train"]
    timed = [r for r in rows if r["step"] >= warm]
    if len(timed) < 2:
        raise SystemExit(f"{recipe_name}: too few logged steps after --warm {warm} to time (use more --steps)")
    first, last = timed[0], timed[-1]
    return {"s_per_step": round((last["time"] - first["time"]) / (last["step"] - first["step"]), 5),
            "from_step": first["step"], "to_step": last["step"],
            "steps_per_epoch": int(round(last["step"] / last["epoch"])),
            "precision": load_recipe(recipe_name, overrides).train.precision}


def run_cost(recipe, steps_per_epoch: int, on: float, off: Optional[float] = None) -> Dict[str, Any]:
    """A whole run of ``recipe``: its steps and the mean step cost over its patch-dropout schedule, the cost
    at rate r taken as ``off + (on - off) * r / rate`` (``on``: at the recipe's rate, ``off``: at none)."""
    s, rate = recipe.schedule, recipe.model_config(10, 1).patch_drop
    steps = s.steps if s.steps is not None else int(round(s.epochs * steps_per_epoch))
    if off is None or not rate or s.patch_drop_end is None:  # the rate (or no dropout) throughout
        frm, mean = None, on
    else:
        frm, end = s.patch_drop_from, off + (on - off) * s.patch_drop_end / rate
        mean = frm * on + (1.0 - frm) * (on + end) / 2
    return {"steps": steps, "epochs": s.epochs, "s_per_step": round(mean, 5), "estimate_s": round(steps * mean, 1),
            "estimate_h": round(steps * mean / 3600, 2),
            "patch_drop_from": frm, "precision": recipe.train.precision}

if __name__ == "__main__":
    sys.exit(main())
