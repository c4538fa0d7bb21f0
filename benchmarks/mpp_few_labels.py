"""Collect the Fashion-MNIST few-label experiment (masked patch prediction, then 1,000 labels, vs the same
1,000 labels from scratch) from its run folders into one JSON and one PNG.

The runs themselves are ordinary vitkit commands (see docs/hybrid_mpp.md)::

    vitkit pretrain-mpp --recipe fmnist-mpp --out RUNS/fmnist-mpp
    vitkit finetune RUNS/fmnist-mpp/model --recipe fmnist-1k --out RUNS/mpp-ft-1k
    vitkit train --recipe fmnist-1k --out RUNS/scratch-1k

    python benchmarks/mpp_few_labels.py --run "from scratch=RUNS/scratch-1k" \
        --run "after MPP=RUNS/mpp-ft-1k" --out docs/figures/mpp/few_labels
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _rows(run: Path):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, metavar="LABEL=RUN_DIR")
    ap.add_argument("--out", required=True, help="output stem: writes STEM.json and STEM.png")
    args = ap.parse_args()
    runs = []
    for item in args.run:
        label, _, path = item.partition("=")
        run = Path(path)
        res = json.loads((run / "results.json").read_text())
        evals = [r for r in _rows(run) if r.get("kind") == "eval"]
        recipe = (run / "recipe.yaml").read_text()
        runs.append({"label": label, "run": str(run), "results": res, "recipe_yaml": recipe,
                     "curve": [(r["epoch"], r.get("top1_ema", r.get("top1"))) for r in evals]})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {r["label"]: {"test_top1": r["results"].get("test_top1_exported", r["results"].get("test_top1")),
                            "steps": r["results"]["steps"], "run": r["run"]} for r in runs}
    (out.with_suffix(".json")).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for r in runs:
        xs, ys = zip(*r["curve"])
        top = summary[r["label"]]["test_top1"]
        ax.plot(xs, [100 * y for y in ys], "o-", ms=3, label=f"{r['label']}: {100 * top:.2f}%")
    ax.set(xlabel="epoch over the 1,000 labelled images", ylabel="test top-1 (%, EMA weights)",
           title="Fashion-MNIST, 1,000 labels (10k test images)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    for label, s in summary.items():
        print(f"{label:24s} {100 * s['test_top1']:.2f}%  ({s['steps']} steps, {s['run']})")


if __name__ == "__main__":
    main()
