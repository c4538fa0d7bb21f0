"""Dynamic int8 quantisation for CPU inference: its accuracy change on real data and its speed.

Accuracy: a ViT trained on Fashion-MNIST by vitkit's training engine (``--checkpoint``, or one trained here
with the ``fmnist-demo`` recipe, a few minutes) evaluated on the 10,000 test images in fp32 and with every
encoder Linear quantised to int8 (``prepare_inference(model, quantize="int8")``). Speed: the same engine
in fp32 and int8 on ViT-B/16 at 224 px, alternated. ONNX Runtime (when installed) runs the same models
exported to ONNX, in fp32 and dynamically quantised to int8 by its own tool (int8 weights per tensor,
activations quantised per call: the same semantics), as the peer a user would pick for int8 on a CPU::

    .venv/bin/python benchmarks/int8.py
"""
import shlex
import sys
import time
from pathlib import Path

import torch

from _common import RESULTS, kind_folder, main_guard
from vitkit.bench import alternate, machine_line
from vitkit.bench.models import build_model, example_batch, model_config
from vitkit.bench.peers import OrtModel, peer_version
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
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<machine kind>/int8.json)")
    args = ap.parse_args()
    args.out = args.out or str(kind_folder() / "int8.json")
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
    acc = {"fp32": acc32, "int8": acc8, "top1_agreement": agree, "max_logit_change": rel}
    ort = peer_version("onnxruntime") is not None
    if ort:
        for kind, q in (("ort_fp32", None), ("ort_int8", "int8")):
            a, p, _ = accuracy(OrtModel(load_model(Path(args.checkpoint)), quantize=q), images, labels)
            acc[kind], acc[kind + "_top1_agreement"] = a, (p32 == p).float().mean().item()
            agree = acc[kind + "_top1_agreement"]
            print(f"  ONNX Runtime {kind[4:]}: {a:.2%} (top-1 agreement with vitkit fp32 {agree:.2%})")

    label, cfg = model_config(args.speed_model)
    base = build_model(cfg)
    fast32 = prepare_inference(base, "fp32")
    fast8 = prepare_inference(build_model(cfg), "fp32", quantize="int8")
    xb = example_batch(cfg, args.batch)
    cases = {"fp32": lambda: fast32(xb), "int8": lambda: fast8(xb)}
    if ort:
        o32, o8 = OrtModel(base), OrtModel(base, quantize="int8")
        cases.update({"ort_fp32": lambda: o32(xb), "ort_int8": lambda: o8(xb)})
    st = alternate(cases, warmup=1, repeats=args.repeats)
    speed = {k: args.batch / s.median for k, s in st.items()}
    print(f"{label} {cfg.img_size[0]}px batch {args.batch}: " + ", ".join(
        f"{k.replace('_', ' ')} {v:.2f} img/s (spread {st[k].spread:.1%})" for k, v in speed.items()))
    print(f"  vitkit int8 (weights packed by torch's {fast8.model._int8_engine!r} engine) / fp32 "
          f"{speed['int8'] / speed['fp32']:.2f}x" + (
        f"; vitkit int8 / ONNX Runtime int8 {speed['int8'] / speed['ort_int8']:.2f}x" if ort else ""))
    write_json_atomic(args.out, {
        "machine_line": line, "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%d"), "checkpoint": args.checkpoint,
        "versions": {"onnxruntime": peer_version("onnxruntime")},
        "int8_engine": getattr(fast8.model, "_int8_engine", None),
        "accuracy": acc,
        "speed": {"model": label, "batch": args.batch, "images_per_s": speed,
                  "stats": {k: s.to_dict() for k, s in st.items()}}})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main_guard(main)
