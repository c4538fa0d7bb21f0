"""Time to accuracy on Fashion-MNIST: a pure ViT trained from scratch on this machine's CPU.

Trains a recipe (default ``fmnist-fast``) with vitkit's engine under the evaluation protocol: the
periodic evaluations (the curve) read the 5,000 validation images held out of the training set, the
exported weights (raw or EMA, chosen on those) are evaluated once on the 10,000 test images. Reports that
test accuracy, the training time, and whether the target was met within the budget, as JSON and as a
curve (validation accuracy against training time).

    .venv/bin/python benchmarks/time_to_accuracy.py                                  # >= 91 % in <= 15 min
    .venv/bin/python benchmarks/time_to_accuracy.py --set train.seed=1 --name fmnist-fast-seed1
    .venv/bin/python benchmarks/time_to_accuracy.py --recipe fmnist-long --target 0.94 --budget-min 0

A target is met when the exported weights' test top-1 reaches it and the run trained for no longer than
the budget (``--budget-min 0``: no time limit). With ``--resume`` the run in ``--out`` is continued (or,
when it is complete, only reported again); the training time then covers every part of the run.
Training time excludes evaluations and checkpoints; it depends on the machine and on what else runs on
it: the JSON records the machine line (CPU, vector instructions, torch build, load).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from vitkit.bench.machine import machine_info
from vitkit.cli._util import parse_overrides
from vitkit.train import load_recipe, train
from vitkit.train.runlog import read_metrics

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures" / "training"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="fmnist-fast")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--target", type=float, default=0.91,
                    help="test top-1 of the exported weights to reach (default 0.91)")
    ap.add_argument("--budget-min", type=float, default=15.0,
                    help="training-time budget in minutes (default 15; 0: none)")
    ap.add_argument("--out", default="runs/time-to-accuracy", help="run folder (replaced)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("--name", help="file stem for the JSON/PNG in docs/figures/training (default: the recipe)")
    ap.add_argument("--seeds", help="comma-separated training seeds: one run each (NAME-seedN.json), then "
                    "NAME.json with every run, the mean and the spread; the target is judged on the mean")
    args = ap.parse_args(argv)
    command = "python benchmarks/time_to_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if not args.seeds:
        summary = run_one(args, parse_overrides(args.set), Path(args.out), args.name, command)
        return 0 if summary["test_top1"] is not None else 1
    seeds = [int(x) for x in args.seeds.split(",")]
    base = args.name or load_recipe(args.recipe, parse_overrides(args.set)).name
    runs = [run_one(args, {**parse_overrides(args.set), "train.seed": seed}, Path(args.out) / f"seed{seed}",
                    f"{base}-seed{seed}", command) for seed in seeds]
    tops = [r["test_top1"] for r in runs]
    mean = sum(tops) / len(tops)
    std = (sum((t - mean) ** 2 for t in tops) / max(len(tops) - 1, 1)) ** 0.5
    budget_s = 60 * args.budget_min if args.budget_min else None
    agg = {"name": base, "recipe": runs[0]["recipe"], "seeds": seeds, "target": args.target,
           "budget_min": args.budget_min or None, "mean_test_top1": mean, "std_test_top1": std,
           "min_test_top1": min(tops), "max_test_top1": max(tops),
           "mean_train_s": sum(r["train_s"] for r in runs) / len(runs),
           "max_train_s": max(r["train_s"] for r in runs),
           "target_met": bool(mean >= args.target and (budget_s is None or all(r["train_s"] <= budget_s + 1.0
                                                                             for r in runs))),
           "runs": [{k: r[k] for k in ("seed", "test_top1", "test_top5", "exported_weights", "train_s", "epochs",
                                       "steps", "stopped_by")} for r in runs],
           "machine": runs[-1]["machine"], "command": command}
    (FIGURES / f"{base}.json").write_text(json.dumps(agg, indent=2) + "\n")
    print(f"{base}: mean test top-1 {100 * mean:.2f}% (std {100 * std:.2f}, {len(runs)} seeds): target "
          f"{100 * args.target:.1f}% {'met' if agg['target_met'] else 'NOT met'}")
    return 0


def run_one(args, overrides, out: Path, name, command):
    """One training run reported as NAME.json / NAME.png / NAME-curves.png in docs/figures/training."""
    recipe = load_recipe(args.recipe, overrides)
    if out.exists() and not args.resume:
        shutil.rmtree(out)
    t0 = time.perf_counter()
    res = train(recipe, out, resume=args.resume, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    # one point per step: a finished run resumed with --resume is evaluated again, and the later row wins
    rows = list({r["step"]: r for r in read_metrics(out) if r.get("kind") == "eval" and r.get("split") == "val"}
                .values())
    curve = [{"epoch": r["epoch"], "train_s": r.get("train_time"), "val_top1": r.get("top1"),
              "val_top1_ema": r.get("top1_ema"), "final": bool(r.get("final"))} for r in rows]
    final = res.get("test_top1")
    train_s = res.get("trained_s")
    budget_s = 60 * args.budget_min if args.budget_min else None
    stem = name or recipe.name
    summary = {
        "name": stem, "recipe": recipe.name, "seed": recipe.train.seed, "target": args.target,
        "budget_min": args.budget_min or None,
        "test_top1": final, "test_top5": res.get("test_top5"), "test_images": res.get("test_images"),
        "exported_weights": res.get("exported_weights"), "selected_by": res.get("selected_by"),
        "val": res.get("val"), "val_images": res.get("val_images"), "train_images": res.get("train_images"),
        # training time of the whole run, resumed parts included (evaluations and checkpoints excluded)
        "train_s": train_s, "wall_s_total": round(wall, 1), "epochs": res.get("epochs"),
        "steps": res.get("steps"), "stopped_by": res.get("stopped_by"), "params": res.get("params"),
        "target_met": bool(final is not None and final >= args.target
                           and (budget_s is None or train_s <= budget_s + 1.0)),
        "curve": curve,
        "machine": machine_info(),
        "command": command,
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(summary, FIGURES / f"{stem}.png")
    shutil.copy(out / "curves.png", FIGURES / f"{stem}-curves.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "curve"}, indent=2))
    print(f"{stem}: test top-1 {100 * final:.2f}% ({summary['exported_weights']} weights, chosen on validation) "
          f"after {train_s / 60:.1f} min of training: target {100 * args.target:.1f}%"
          + (f" in {args.budget_min:g} min" if budget_s else "") + (" met" if summary["target_met"] else " NOT met"))
    return summary


def _plot(summary, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = summary["curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    t = [p["train_s"] / 60 for p in c]
    ax.plot(t, [100 * (p["val_top1"] or 0) for p in c], "o-", ms=3, label="validation, raw weights")
    if any(p["val_top1_ema"] is not None for p in c):
        ax.plot(t, [100 * (p["val_top1_ema"] or 0) for p in c], "s--", ms=3, label="validation, EMA")
    ax.plot([summary["train_s"] / 60], [100 * summary["test_top1"]], "r*", ms=12,
            label=f"test, exported ({summary['exported_weights']}): {100 * summary['test_top1']:.2f}%")
    ax.axhline(100 * summary["target"], color="gray", lw=0.8, ls=":", label=f"target {100 * summary['target']:g}%")
    if summary["budget_min"]:
        ax.axvline(summary["budget_min"], color="red", lw=0.8, ls=":", label=f"{summary['budget_min']:g} min")
    ax.set(xlabel="training time (min, evaluations excluded)", ylabel="Fashion-MNIST top-1 (%)",
           title=f"{summary['name']}: test {100 * summary['test_top1']:.2f}% "
                 f"({summary['machine']['cores']} cores, {summary['machine']['host_cpu'][:28]})")
    vals = [100 * v for p in c for v in (p["val_top1"], p["val_top1_ema"]) if v is not None]
    lo = min(vals[len(vals) // 4:] + [100 * summary["target"]]) - 2 if vals else 50
    ax.set_ylim(max(lo, 50), 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
