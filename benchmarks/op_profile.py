"""Where a forward pass spends its time: GEMMs against everything else, beside the GEMM roofline.

The roofline target (benchmarks/verdict.py: >= 90% of the fastest GEMM rate torch reaches at the model's shapes) can
only be met if the work that is not a matrix product (LayerNorm, GELU, softmax, residual adds, copies)
costs less than about a tenth of the GEMMs. This script profiles ``prepare_inference(model, dtype)`` of
one model (torch.profiler, self time per operator), sorts the operators into GEMMs and the rest, and
measures the roofline of the same shapes in the same run, so the JSON says how much of the gap is the
GEMMs running slower inside the model than alone, and how much is the rest::

    .venv-peers/bin/python benchmarks/op_profile.py --dtype fp32 bf16      # results/<kind>/op-profile-B16.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict

import torch

from _common import kind_folder, main_guard
from vitkit.bench.machine import machine_info, machine_line
from vitkit.bench.models import build_model, example_batch, model_config
from vitkit.bench.roofline import roofline
from vitkit.models.cost import cost
from vitkit.models.inference import prepare_inference, resolve_dtype

# operators whose self time is a matrix product (ATen, MKL, oneDNN entry points torch records)
GEMM_OPS = ("aten::addmm", "aten::addmm_", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
            "mkldnn::_linear_pointwise", "aten::mkldnn_linear", "aten::_mkldnn_linear",
            "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::convolution_overrideable",
            "aten::mkldnn_convolution", "aten::_convolution")


def is_gemm(name: str) -> bool:
    return name in GEMM_OPS or "linear_pointwise" in name or name.endswith("::mm")


def profile(model, x, repeats: int):
    with torch.inference_mode():
        for _ in range(2):
            model(x)
        walls = []
        for _ in range(repeats):
            t = time.perf_counter()
            model(x)
            walls.append(time.perf_counter() - t)
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof

        with prof(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(repeats):
                model(x)
    ops = defaultdict(float)
    for e in p.key_averages():
        ops[e.key] += e.self_cpu_time_total / 1e6 / repeats  # seconds per forward
    return statistics.median(walls), dict(ops)


def softmax_seconds(cfg, batch: int, dtype: str, repeats: int) -> float:
    """Median seconds of one softmax over a layer's attention scores [batch, heads, tokens, tokens] in the
    benchmark's dtype (torch computes a bf16 softmax in fp32 inside, as the fused kernel does)."""
    t = cost(cfg).tokens
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(batch, cfg.num_heads, t, t, generator=g).to(resolve_dtype(dtype))
    with torch.inference_mode():
        scores.softmax(-1)
        times = []
        for _ in range(max(3, repeats)):
            t0 = time.perf_counter()
            scores.softmax(-1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="B/16")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/<machine kind>/op-profile-MODEL.json)")
    args = ap.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    spec, cfg = model_config(args.model, args.img_size)
    x = example_batch(cfg, args.batch)
    out = {"command": command, "machine": machine_line(), "machine_info": machine_info(), "model": spec,
           "img_size": args.img_size, "batch": args.batch, "runs": {}}
    for dtype in args.dtype:
        model = prepare_inference(build_model(cfg), dtype)
        wall, ops = profile(model, x, args.repeats)
        gemm = sum(v for k, v in ops.items() if is_gemm(k))
        rest = sum(v for k, v in ops.items() if not is_gemm(k))
        roof = roofline(cfg, args.batch, dtype, repeats=args.repeats)
        roof_s = roof.seconds_per_image * args.batch
        top = sorted(((k, v) for k, v in ops.items() if not is_gemm(k)), key=lambda kv: -kv[1])[:12]
        # the fused attention kernel counts as GEMMs above; split its time: its two products at the roofline's
        # rates, and a softmax over the same scores alone (the exponentials the kernel must compute too)
        attn_kernel = sum(v for k, v in ops.items() if "scaled_dot_product" in k)
        attn_roof = sum(r.gemm.flops / r.flops_per_s for r in roof.rates
                        if r.gemm.name.endswith(("attn_scores", "attn_values")))
        softmax = softmax_seconds(cfg, args.batch, dtype, args.repeats) * cfg.depth
        rec = {"forward_s": wall, "images_per_s": args.batch / wall, "profiled_gemm_s": gemm,
               "profiled_other_s": rest, "roofline_s": roof_s, "roofline_images_per_s": roof.images_per_s,
               "fraction_of_roofline": roof_s / wall,
               # the best the model could reach with its GEMMs at the roofline rates and the rest unchanged
               "ceiling_with_other_ops": roof_s / (roof_s + rest),
               "gemm_slowdown_in_model": gemm / roof_s, "top_other_ops_s": dict(top),
               "gemm_ops_s": {k: v for k, v in ops.items() if is_gemm(k)},
               "attention_kernel_s": attn_kernel, "attention_products_roofline_s": attn_roof,
               "attention_softmax_alone_s": softmax}
        out["runs"][dtype] = rec
        print(f"{spec} {dtype} batch {args.batch}: {rec['images_per_s']:.2f} img/s = "
              f"{rec['fraction_of_roofline']:.0%} of the roofline {roof.images_per_s:.2f} img/s; per forward "
              f"{wall * 1e3:.0f} ms: GEMMs {gemm * 1e3:.0f} ms (the roofline's {roof_s * 1e3:.0f} ms: "
              f"{rec['gemm_slowdown_in_model']:.2f}x), other operators {rest * 1e3:.0f} ms -> with GEMMs at the "
              f"roofline rates the rest caps the fraction at {rec['ceiling_with_other_ops']:.0%}")
        print(f"    attention kernel {attn_kernel * 1e3:.0f} ms: its products at the roofline rates "
              f"{attn_roof * 1e3:.0f} ms, a softmax over the same scores alone {softmax * 1e3:.0f} ms")
        for k, v in top[:6]:
            print(f"    {k:<40s} {v * 1e3:8.1f} ms")
    path = args.out or str(kind_folder() / f"op-profile-{spec.replace('/', '')}.json")
    kind_folder().mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"command: {command}\n{out['machine']}\nwrote {path}")


if __name__ == "__main__":
    main_guard(main)
