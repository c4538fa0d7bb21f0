"""CPU kernel choices of the model, measured: attention and patch embedding, forward + backward.

On a CPU vitkit computes attention as explicit softmax(QK^T/sqrt(d))V for sequences up to
``CPU_EXPLICIT_ATTENTION_MAX_TOKENS`` tokens and with torch's fused kernel above, and in training projects
patch vectors of up to ``PatchEmbed.GEMM_MAX_PATCH_VALUES`` values as one GEMM instead of a convolution.
This script times both alternatives of each choice on the shapes of the Fashion-MNIST, CIFAR and ImageNet
models, in the same process, and prints the ratio (> 1: the path vitkit takes for that shape is faster);
then whole training steps (``TrainStep``: forward, backward, clipping, fused AdamW) of the Fashion-MNIST
recipes' models with both choices on and both off, alternating, at the recipes' batch size::

    .venv/bin/python benchmarks/cpu_kernels.py            # both cores
    .venv/bin/python benchmarks/cpu_kernels.py --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from vitkit.models import VisionTransformer, precision
from vitkit.models.layers import PatchEmbed
from vitkit.train import load_recipe
from vitkit.train.optim import build_optimizer
from vitkit.train.step import TrainStep

ATTENTION = [  # batch, heads, tokens, head dim
    (64, 2, 17, 32), (64, 2, 49, 32), (128, 4, 16, 32), (64, 4, 65, 32), (32, 6, 197, 64), (16, 12, 197, 64),
    (8, 12, 577, 64)]
PATCHES = [  # batch, channels, image size, patch, width
    (64, 1, 28, 4, 64), (128, 1, 28, 7, 128), (128, 3, 32, 4, 192), (64, 3, 64, 8, 384), (32, 3, 224, 16, 384)]


def _time(fn, seconds: float, repeats: int) -> float:
    """Median seconds per call over ``repeats`` windows of ``seconds``."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=0.5, help="per timing window")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--recipes", nargs="*", default=["fmnist-fast", "fmnist-demo"],
                    help="recipes whose model's training step is timed (none: skip)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times: median ms per forward+backward")
    print("\nattention (fp32): fused kernel vs explicit; vitkit takes explicit up to "
          f"{precision.CPU_EXPLICIT_ATTENTION_MAX_TOKENS} tokens")
    for b, h, t, d in ATTENTION:
        q, k, v = (torch.randn(b, h, t, d, requires_grad=True) for _ in range(3))
        g = torch.randn(b, h, t, d)
        fused = _time(lambda: F.scaled_dot_product_attention(q, k, v).backward(g), args.seconds, args.repeats)
        expl = _time(lambda: precision._explicit_attention(q, k, v, None, 0.0).backward(g), args.seconds,
                     args.repeats)
        ours = "explicit" if t <= precision.CPU_EXPLICIT_ATTENTION_MAX_TOKENS else "fused"
        gain = fused / expl if ours == "explicit" else expl / fused
        print(f"  B{b:<4d} heads {h:<3d} tokens {t:<4d} dim {d:<3d}  fused {1e3 * fused:8.2f}  explicit "
              f"{1e3 * expl:8.2f}  vitkit: {ours:8s} {gain:5.2f}x the other")
    print("\npatch embedding in training (fp32, weight gradient): convolution vs GEMM; vitkit takes the GEMM up "
          f"to {PatchEmbed.GEMM_MAX_PATCH_VALUES} values per patch")
    for b, c, s, p, w in PATCHES:
        emb = PatchEmbed((p, p), c, w)
        x = torch.randn(b, c, s, s)
        conv = _time(lambda: emb.proj(x).sum().backward(), args.seconds, args.repeats)
        gemm = _time(lambda: emb._gemm(x).sum().backward(), args.seconds, args.repeats)
        ours = "gemm" if c * p * p <= PatchEmbed.GEMM_MAX_PATCH_VALUES else "conv"
        gain = conv / gemm if ours == "gemm" else gemm / conv
        print(f"  B{b:<4d} {c}x{s}x{s} patch {p:<3d} width {w:<4d}  conv {1e3 * conv:8.2f}  gemm "
              f"{1e3 * gemm:8.2f}  vitkit: {ours:5s} {gain:5.2f}x the other")
    print("\ntraining step (fp32, batch 64, patch dropout as the recipe starts): torch's fused attention + "
          "convolution vs vitkit's choices")
    for name in args.recipes:
        recipe = load_recipe(name)
        model = VisionTransformer(recipe.model_config(num_classes=10, in_chans=1))
        step = TrainStep(model, build_optimizer(model, recipe.optim, torch.device("cpu")), clip_grad=1.0)
        x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
        times = {"torch": [], "vitkit": []}
        ours = precision.CPU_EXPLICIT_ATTENTION_MAX_TOKENS, PatchEmbed.GEMM_MAX_PATCH_VALUES
        for _ in range(args.repeats):
            for which in times:
                limits = (0, 0) if which == "torch" else ours
                precision.CPU_EXPLICIT_ATTENTION_MAX_TOKENS, PatchEmbed.GEMM_MAX_PATCH_VALUES = limits
                times[which].append(_time(lambda: step(x, y), 4 * args.seconds, 1))
        precision.CPU_EXPLICIT_ATTENTION_MAX_TOKENS, PatchEmbed.GEMM_MAX_PATCH_VALUES = ours
        old, new = (statistics.median(v) for v in times.values())
        print(f"  {name:12s} patch {model.config.patch_size[0]} width {model.config.width} patch_drop "
              f"{model.config.patch_drop:.2f}:  torch kernels {64 / old:7.0f} img/s  vitkit {64 / new:7.0f} img/s  "
              f"{old / new:5.2f}x")


if __name__ == "__main__":
    main()
