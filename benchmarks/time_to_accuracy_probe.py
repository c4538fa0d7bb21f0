"""Which small ViT learns Fashion-MNIST fastest per image? A short probe: each variant sees the same number of
training images (default 15,000 = 0.25 epoch, warm-up 10 % + cosine) and is scored on the 10,000 test images.

    flock /work/cpu.lock .venv/bin/python benchmarks/time_to_accuracy_probe.py            # all variants
    flock /work/cpu.lock .venv/bin/python benchmarks/time_to_accuracy_probe.py D E --images 30000

Results go to docs/figures/training/probe-<images>-images.json. Accuracy per image is the point; the times
are the machine's (and whatever else runs on it).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from vitkit.train import load_recipe, train

# The first Fashion-MNIST recipe tried: patch 4 (7x7 tokens), width 64, GAP, pad-crop + flip.
BASE = {"model": {"img_size": 28, "patch_size": 4, "width": 64, "depth": 6, "num_heads": 4, "mlp_dim": 128,
                  "pool": "gap", "class_token": False, "posemb": "learn"},
        "augment.crop": "pad", "augment.pad": 2, "augment.flip": True, "augment.label_smoothing": 0.1,
        "train.ema": 0.998, "optim.weight_decay": 0.05}
VARIANTS = {
    "A": {"optim.batch_size": 128, "optim.lr": 3e-3},
    "B": {"optim.batch_size": 32, "optim.lr": 1e-3, "augment.crop": "none"},
    "C": {"optim.batch_size": 64, "optim.lr": 2e-3, "augment.crop": "none"},
    "D": {"optim.batch_size": 64, "optim.lr": 2e-3, "augment.crop": "none", "model.patch_size": 7,
          "model.width": 128, "model.mlp_dim": 256},
    "E": {"optim.batch_size": 64, "optim.lr": 2e-3, "augment.crop": "none", "model.pool": "token",
          "model.class_token": True},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--images", type=int, default=15000)
    ap.add_argument("--out", default="runs/probe")
    args = ap.parse_args(argv)
    rows = []
    for key in args.variants:
        ov = dict(BASE, **VARIANTS[key])
        bs = ov["optim.batch_size"]
        steps = args.images // bs
        ov.update({"schedule.steps": steps, "schedule.warmup_steps": max(1, steps // 10), "train.eval_every": 0,
                   "train.log_every": 1000, "train.predictions": 0})
        model = dict(ov.pop("model"))
        for k in [k for k in ov if k.startswith("model.")]:
            model[k.split(".", 1)[1]] = ov.pop(k)
        ov["model"] = model
        out = Path(args.out) / key
        shutil.rmtree(out, ignore_errors=True)
        r = train(load_recipe("fmnist-fast", ov), out, progress=False)
        rows.append({"variant": key, "changes": VARIANTS[key], "test_top1": r["test_top1"],
                     "test_top1_ema": r["test_top1_ema"], "train_s": r["train_s_excluding_eval"]})
        print(json.dumps(rows[-1]), flush=True)
    dest = Path(__file__).resolve().parents[1] / "docs" / "figures" / "training" / f"probe-{args.images}-images.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps({"base": BASE, "images": args.images, "results": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
