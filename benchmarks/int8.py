"""Dynamic int8 quantisation for CPU inference: its accuracy change on real data and its speed.

Accuracy: a ViT trained on Fashion-MNIST by vitkit's training engine (``--checkpoint``, or one trained here
with the ``fmnist-demo`` recipe, a few minutes) evaluated on the 10,000 test images in fp32 and with every
encoder Linear quantised to int8 (``prepare_inference(model, quantize="int8")``). Speed: the same engine
in fp32 and int8 on ViT-B/16 at 224 px, alternated::

    flock /work/cpu.lock .venv/bin/python benchmarks/int8.py
"""
import shlex
import sys
import time
from pathlib import Path

import torch

from _common import RESULTS, main_guard
from vitkit.bench import alternate, machine_line
from vitkit.bench.models import build_model, example_batch, model_config
from vitkit.checkpoints import load_model
from vitkit.data.idx import load_fashion_mnist
from vitkit.models.inference import prepare_inference
from vitkit.utils import write_json_atomic


def trained_model(path: Path):
    if not (path / "vitkit.json").exists():
        from vitkit.train import load_recipe, train

        print(f"training a Fashion-MNIST model into {path.parent} (recipe fmnist-demo)", file=sys.stderr)
        train(load_recipe("fmnist-demo"), path.parent, progress=False)
    return load_model(path)


def accuracy(fn, images: torch.Tensor, labels: torch.Tensor, batch: int = 1000):
    preds, logits = [], []
    for i in range(0, len(images), batch):
        out = fn(images[i:i + batch]).float()
        logits.append(out)
        preds.append(out.argmax(1))
    p = torch.cat(preds)
    return (p == labels).float().mean().item(), p, torch.cat(logits)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(RESULTS / "int8-fmnist" / "model"))
    ap.add_argument("--speed-model", default="B/16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "int8.json"))
    args = ap.parse_args()
    line = machine_line()
    print(line)
    model = trained_model(Path(args.checkpoint))
    pre = model.meta.preprocessing or {}
    mean, std = pre.get("mean", [0.2860]), pre.get("std", [0.3530])
    x, y = load_fashion_mnist("test")
    images = (torch.from_numpy(x).float().div(255).unsqueeze(1) - mean[0]) / std[0]
    labels = torch.from_numpy(y).long()
    fp32 = prepare_inference(model, "fp32")
    int8 = prepare_inference(load_model(Path(args.checkpoint)), "fp32", quantize="int8")
    acc32, p32, l32 = accuracy(fp32, images, labels)
    acc8, p8, l8 = accuracy(int8, images, labels)
    agree = (p32 == p8).float().mean().item()
    rel = ((l32 - l8).abs().max() / l32.abs().max()).item()
    print(f"Fashion-MNIST test accuracy: fp32 {acc32:.2%}, int8 {acc8:.2%} (change {100 * (acc8 - acc32):+.2f} "
          f"points); top-1 agreement {agree:.2%}; max logit change {rel:.2%} of the largest logit")

    label, cfg = model_config(args.speed_model)
    base = build_model(cfg)
    fast32 = prepare_inference(base, "fp32")
    fast8 = prepare_inference(build_model(cfg), "fp32", quantize="int8")
    xb = example_batch(cfg, args.batch)
    st = alternate({"fp32": lambda: fast32(xb), "int8": lambda: fast8(xb)}, warmup=1, repeats=args.repeats)
    speed = {k: args.batch / s.median for k, s in st.items()}
    print(f"{label} {cfg.img_size[0]}px batch {args.batch}: fp32 {speed['fp32']:.2f} img/s, int8 "
          f"{speed['int8']:.2f} img/s ({speed['int8'] / speed['fp32']:.2f}x; spreads "
          f"{st['fp32'].spread:.1%} / {st['int8'].spread:.1%})")
    write_json_atomic(args.out, {
        "machine_line": line, "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%d"), "checkpoint": args.checkpoint,
        "accuracy": {"fp32": acc32, "int8": acc8, "top1_agreement": agree, "max_logit_change": rel},
        "speed": {"model": label, "batch": args.batch, "images_per_s": speed,
                  "stats": {k: s.to_dict() for k, s in st.items()}}})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main_guard(main)
