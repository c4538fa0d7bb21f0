"""Time to accuracy on Fashion-MNIST: a pure ViT trained from scratch on this machine's CPU.

Trains a recipe (default ``fmnist-fast``) with vitkit's engine, evaluating on the 10,000 test images
after every epoch, and reports the wall time at which the test accuracy first reached the target, the
final accuracy and the training time, as JSON and as a curve (accuracy against wall time).

    flock /work/cpu.lock .venv/bin/python benchmarks/time_to_accuracy.py                    # >= 91 % in <= 15 min
    nice -n 15 .venv/bin/python benchmarks/time_to_accuracy.py --recipe fmnist-long --target 0.94

With ``--resume`` the run in ``--out`` is continued (or, when it is complete, only evaluated and
reported again); the training time then covers every part of the run.

Wall times are those of the run itself (data in memory, evaluations excluded from "training time");
they depend on the machine and on what else runs on it: the JSON records the CPU count and load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from vitkit.train import load_recipe, train
from vitkit.train.runlog import read_metrics
from vitkit.cli._util import parse_overrides

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures" / "training"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="fmnist-fast")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--target", type=float, default=0.91, help="test top-1 to reach (default 0.91)")
    ap.add_argument("--budget-min", type=float, default=15.0, help="training-time budget in minutes (default 15)")
    ap.add_argument("--out", default="runs/time-to-accuracy", help="run folder (replaced)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --out")
    ap.add_argument("--name", help="file stem for the JSON/PNG in docs/figures/training (default: the recipe)")
    args = ap.parse_args(argv)

    recipe = load_recipe(args.recipe, parse_overrides(args.set))
    out = Path(args.out)
    if out.exists() and not args.resume:
        shutil.rmtree(out)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    res = train(recipe, out, resume=args.resume, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    # one point per step: a finished run resumed with --resume is evaluated again, and the later row wins
    rows = list({r["step"]: r for r in read_metrics(out) if r.get("kind") == "eval"}.values())
    curve = []
    for r in rows:
        best = max(r.get("top1") or 0.0, r.get("top1_ema") or 0.0)
        curve.append({"epoch": r["epoch"], "train_s": r.get("train_time"), "wall_s": r.get("time"),
                      "top1": r.get("top1"), "top1_ema": r.get("top1_ema"), "best": best})
    reached = next((c for c in curve if c["best"] >= args.target), None)
    final = res.get("test_top1_exported", res.get("test_top1"))
    stem = args.name or recipe.name
    summary = {
        "name": stem, "recipe": recipe.name, "target": args.target, "budget_min": args.budget_min,
        "final_top1": final, "final_top1_raw": res.get("test_top1"), "final_top1_ema": res.get("test_top1_ema"),
        # training time of the whole run, resumed parts included (evaluations and checkpoints excluded)
        "train_s": res.get("trained_s", res.get("train_s_excluding_eval")), "wall_s_total": round(wall, 1),
        "reached_target": reached is not None,
        "time_to_target_train_s": reached["train_s"] if reached else None,
        "within_budget": bool(reached and reached["train_s"] <= 60 * args.budget_min),
        "epochs": res.get("epochs"), "params": res.get("params"), "curve": curve,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_at_start": load,
                    "torch": torch.__version__, "python": platform.python_version()},
        "command": "python benchmarks/time_to_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(summary, FIGURES / f"{stem}.png")
    shutil.copy(out / "curves.png", FIGURES / f"{stem}-curves.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "curve"}, indent=2))
    tt = summary["time_to_target_train_s"]
    print(f"{recipe.name}: final test top-1 {100 * final:.2f}% after {summary['train_s']:.0f} s of training; "
          + (f"reached {100 * args.target:.1f}% after {tt:.0f} s ({tt / 60:.1f} min)" if tt is not None
             else f"did not reach {100 * args.target:.1f}%"))
    return 0


def _plot(summary, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = summary["curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["train_s"] / 60 for p in c], [100 * (p["top1"] or 0) for p in c], "o-", ms=3, label="raw weights")
    if any(p["top1_ema"] is not None for p in c):
        ax.plot([p["train_s"] / 60 for p in c], [100 * (p["top1_ema"] or 0) for p in c], "s--", ms=3, label="EMA")
    ax.axhline(100 * summary["target"], color="gray", lw=0.8, ls=":", label=f"target {100 * summary['target']:.0f}%")
    ax.axvline(summary["budget_min"], color="red", lw=0.8, ls=":", label=f"{summary['budget_min']:.0f} min")
    ax.set(xlabel="training time (min, evaluations excluded)", ylabel="Fashion-MNIST test top-1 (%)",
           title=f"{summary.get('name', summary['recipe'])}: {100 * summary['final_top1']:.2f}% ({summary['machine']['cpus']} CPU cores)")
    lo = min([100 * p["best"] for p in c] + [100 * summary["target"]]) - 2
    ax.set_ylim(max(lo, 50), 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
