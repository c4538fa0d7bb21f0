"""CPU kernel choices of the model, measured; writes benchmarks/results/<machine kind>/cpu_kernels.json.

Each choice is timed every way in the same process by :func:`vitkit.timing.alternate` (warm-up, rounds in
rotating order, each round at least ``--seconds`` long), the median of ``--repeats`` rounds. "vitkit" is the
choice of the kernel plan a model of that shape gets here (:mod:`vitkit.models.kernel_plan`): planned as
``prepare_inference`` and the trainer plan it (:func:`vitkit.models.planner.plan`: the declared backend, the
measurements kept for this machine, and a timing of the model's shape for any ``auto`` choice not kept yet;
``--no-measure``: the measurements kept only, the static default where there are none).

- attention: each path of :func:`vitkit.models.ops.attention` - torch's fused kernel, the explicit
  softmax(QK^T/sqrt(d))V, and for bf16 the fused kernel on operands widened to fp32 - on q/k/v laid out as the
  model has them (strided views of the qkv projection's rows), fp32 and bf16, forward + backward (training)
  and forward only (inference); vitkit's choice is the attention path of the plan of a ViT with that many
  heads, head width and tokens (bf16 widened to fp32 where bf16 GEMMs are not native);
- patch embedding: the stride-P convolution vs one GEMM over flattened patches (vitkit's only path),
  training (forward + backward) and inference;
- GEMM library of the inference products: ATen (``addmm``: MKL in fp32) vs oneDNN's linear
  (``torch.ops.mkldnn._linear_pointwise``) through :func:`vitkit.models.ops.dense`, fp32 and bf16, at
  ViT-B/16's shapes (vitkit's choice: the ViT-B/16 plan's, which times whole encoder blocks; this is the wider
  table behind it);
- GEMM library of the training products (forward with bias, gradient of the input, gradient of the weight)
  at ViT-S/16's shapes, ATen vs oneDNN's linear on the operands as autograd has them (transposed views),
  and where oneDNN wins a product, the dense layer's forward + backward with each product on its winner
  (:func:`vitkit.models.ops.linear` with that mix: ``ChosenLinear``) against ``F.linear``'s, layer by layer
  (vitkit's training choice times whole encoder blocks of the model's shape with each mix);
- GELU after the first MLP product (:func:`vitkit.models.ops.dense_gelu`): the product, then ``gelu_`` in
  place (ATen) vs oneDNN's linear with GELU as its post-op (one pass over the hidden activations instead of
  two), fp32 and bf16; vitkit runs the one its plan's GEMM library gives;
- the inference chunk size of one ViT-B/16 block (bound to the ViT-B/16 plan) at batch 64: vitkit's rule
  (chunks of whole images whose largest temporary stays within the plan's ``chunk_bytes``) vs fixed token
  counts and the whole batch;
- the last block for the head's tokens: ViT-B/16's logits at batch 16 as ``model(x)`` computes them in
  inference (the last block for the plan's ``head_tokens`` only: the class token) vs the same model over
  every token (``forward_head(forward_features(x))``), fp32 and bf16, with the largest logit difference.

A ratio > 1 means the path vitkit takes is faster::

    .venv/bin/python benchmarks/cpu_kernels.py            # both cores
    .venv/bin/python benchmarks/cpu_kernels.py --threads 1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict

import torch
import torch.nn.functional as F

from vitkit.bench.machine import machine_info, machine_line
from vitkit.config import ViTConfig, config_from_name
from vitkit.models import ops
from vitkit.models.kernel_plan import KernelPlan, bind, chunk_images, current, resolve, widest_row
from vitkit.models.layers import Block, PatchEmbed
from vitkit.models.planner import plan as plan_kernels
from vitkit.timing import alternate

ATTENTION = [  # batch, heads, tokens, head dim
    (100, 4, 49, 16), (256, 4, 16, 32), (64, 4, 65, 32), (16, 6, 197, 64), (16, 12, 197, 64), (8, 12, 577, 64)]
PATCHES = [  # batch, channels, image size, patch, width
    (64, 1, 28, 4, 64), (128, 1, 28, 7, 128), (128, 3, 32, 4, 192), (64, 3, 64, 8, 384), (32, 3, 224, 16, 768)]
GEMMS = [  # rows, in, out: ViT-B/16 at batch 16 (3152 tokens) - qkv, proj, fc1, fc2
    (3152, 768, 2304), (3152, 768, 768), (3152, 768, 3072), (3152, 3072, 768)]
TRAIN_GEMMS = [  # rows, in, out: ViT-S/16 at batch 16 (3152 tokens) - qkv, proj, fc1, fc2
    (3152, 384, 1152), (3152, 384, 384), (3152, 384, 1536), (3152, 1536, 384)]
CHUNKS = [None, 2048, 4096, 8192, 1 << 30]  # tokens per chunk; None: vitkit's rule (the plan's chunk_bytes)
PATHS = ("fused", "explicit", "widened")  # "widened": bf16 only


def median_times(fns: dict, seconds: float, repeats: int) -> Dict[str, float]:
    """Median seconds per call of each function: :func:`vitkit.timing.alternate`, rounds of at least
    ``seconds`` in rotating order."""
    return {k: s.median for k, s in alternate(fns, repeats=repeats, min_seconds=seconds).items()}


class Planner:
    """The kernel plans the rows report vitkit's choice from (one per config and dtype)."""

    def __init__(self, measure: bool):
        self.measure = measure
        self.plans: Dict[str, dict] = {}

    def __call__(self, label: str, cfg: ViTConfig, dtype: torch.dtype, only_attention: bool = False) -> KernelPlan:
        back = current()
        if only_attention and back.gemm == "auto":  # a synthetic model: its GEMMs are not reported, not timed
            back = back.replace(gemm="aten")
        kp = (plan_kernels(cfg, dtype, backend=back) if self.measure else
              resolve(cfg, dtype, backend=back))
        self.plans[f"{label} {str(dtype)[6:]}"] = kp.as_dict()
        return kp


def attention_config(heads: int, tokens: int, dim: int) -> ViTConfig:
    """A ViT whose blocks attend like an attention row: ``heads`` heads of width ``dim`` over ``tokens``
    tokens (patches and a class token where ``tokens - 1`` is a square, else patches only)."""
    side = round((tokens - 1) ** 0.5)
    cls = side * side == tokens - 1
    side = side if cls else round(tokens ** 0.5)
    assert side * side + cls == tokens, tokens
    return ViTConfig(img_size=16 * side, patch_size=16, width=heads * dim, num_heads=heads, mlp_dim=4 * heads * dim,
                     depth=1, class_token=cls, pool="token" if cls else "gap")


def run_attention(path: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One attention path as the model runs it (:func:`ops.attention`); ``widened``: the fused kernel on
    operands widened exactly to fp32, the result rounded to bf16 (what ``ops.attention`` runs for bf16 on a
    CPU without bf16 GEMMs)."""
    if path == "widened":
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(q.dtype)
    return ops.attention(q, k, v, path=path)


def layer_step(mix, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, grad: torch.Tensor) -> None:
    """One dense layer's forward + backward on fresh leaves, as a training model's layer runs it
    (:func:`ops.linear`: ``F.linear`` for mix None, else each product on the mix's library)."""
    xr, wr, br = (t.detach().requires_grad_() for t in (x, w, b))
    ops.linear(xr, wr, br, mix).backward(grad)


def run_chunks(blk: Block, x: torch.Tensor, per: int) -> torch.Tensor:
    """The block on chunks of ``per`` whole images, as the model's forward_features runs its encoder."""
    return torch.cat([blk(c)[0] for c in x.split(per)])


def time_readout(seconds: float, repeats: int, batch: int = 16, spec: str = "B/16") -> list:
    """A model's logits in inference: the last block for the head's tokens (vitkit) vs over every token."""
    from vitkit.bench.models import build_model, example_batch, model_config

    print(f"\nlast block for the head's tokens, {spec} logits at batch {batch}: model(x) (the plan's head_tokens "
          f"only) vs forward_head(forward_features(x)) (every token)")
    out = []
    cfg = model_config(spec)[1]
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(cfg).to(dtype).eval()
        x = example_batch(cfg, batch).to(dtype)
        fns = {"readout": lambda: model(x), "every_token": lambda: model.forward_head(model.forward_features(x))}
        with torch.inference_mode():
            diff = (fns["readout"]().float() - fns["every_token"]().float()).abs().max().item()
            st = median_times(fns, seconds, repeats)
        ratio = st["every_token"] / st["readout"]
        out.append({"model": spec, "dtype": str(dtype), "batch": batch, "rows": model.kernel_plan.head_tokens,
                    "readout_ms": 1e3 * st["readout"], "every_token_ms": 1e3 * st["every_token"], "ratio": ratio,
                    "readout_images_per_s": batch / st["readout"],
                    "every_token_images_per_s": batch / st["every_token"], "max_abs_diff": diff,
                    "kernel_plan": model.kernel_plan.describe()})
        print(f"  {str(dtype)[6:]:9s} head rows {1e3 * st['readout']:8.1f} ms  every token "
              f"{1e3 * st['every_token']:8.1f} ms  vitkit: read-out {ratio:5.2f}x the other  (max |diff| {diff:.2g})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=0.5, help="per timing round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/<machine kind>/cpu_kernels.json)")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["attention", "patches", "gemm", "training-gemm", "gelu", "chunks", "readout"])
    ap.add_argument("--readout-model", default="B/16", help="the model of the readout rows")
    ap.add_argument("--no-measure", action="store_true",
                    help="vitkit's choices from the measurements kept for this machine only (no planner timing)")
    args = ap.parse_args()
    if args.out is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _common import kind_folder

        args.out = str(kind_folder() / "cpu_kernels.json")
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info()
    line = machine_line(info)
    print(line)
    print("times: median ms per call; ratio > 1: vitkit's path is faster")
    planned = Planner(measure=not args.no_measure)
    b16 = config_from_name("B/16")
    bf16_native = ops.cpu_has_native_bf16()
    res = {"machine": info, "machine_line": line, "command": "python " + " ".join(sys.argv),
           "backend": current().spec, "plans": planned.plans,
           "attention": [], "patches": [], "gemm": [], "training_gemm": [], "training_layer": [], "chunks": []}
    if "attention" not in args.skip:
        print(f"\nattention in the model's layout (q/k/v views of the qkv rows, output back to token rows), by each "
              f"path of ops.attention: fused kernel, explicit softmax(QK^T)V, and for bf16 the fused kernel on "
              f"operands widened to fp32; vitkit's choice is the plan's path for a ViT of that shape "
              f"({current().spec}{'' if args.no_measure else ': auto times each shape once'})")
        for dtype in (torch.float32, torch.bfloat16):
            paths = [p for p in PATHS if p != "widened" or dtype == torch.bfloat16]
            for b, h, t, d in ATTENTION:
                qkv = torch.randn(b * t, 3 * h * d).to(dtype).requires_grad_()
                g = torch.randn(b * t, h * d).to(dtype)
                row = {"shape": [b, h, t, d], "dtype": str(dtype)}
                kp = planned(f"attention heads={h} tokens={t} dim={d}", attention_config(h, t, d), dtype,
                             only_attention=True)
                for mode in ("train", "inference"):
                    def run(path, mode=mode):
                        def call():
                            with torch.inference_mode(mode == "inference"):
                                out = ops.merge_heads(run_attention(path, *ops.split_heads(qkv, b, t, h, d)))
                                if mode == "train":
                                    out.backward(g)
                                    qkv.grad = None
                        return call
                    ours = kp.attention_for(dtype, grad=mode == "train")
                    if ours == "fused" and dtype == torch.bfloat16 and not bf16_native:
                        ours = "widened"  # ops.attention widens bf16 operands on this CPU
                    st = median_times({p: run(p) for p in paths}, args.seconds, args.repeats)
                    best_other = min((p for p in paths if p != ours), key=st.get)
                    gain = st[best_other] / st[ours]
                    row[mode] = {**{f"{p}_ms": 1e3 * st[p] for p in paths}, "vitkit": ours,
                                 "fastest": min(paths, key=st.get), "ratio": gain}
                    times = "  ".join(f"{p} {1e3 * st[p]:8.2f}" for p in paths)
                    print(f"  {str(dtype)[6:]:8s} {mode:9s} B{b:<4d} heads {h:<3d} tokens {t:<4d} dim {d:<3d}  "
                          f"{times}  vitkit: {ours:8s} {gain:5.2f}x the next best")
                res["attention"].append(row)
    if "patches" not in args.skip:
        print("\npatch embedding (fp32): convolution vs GEMM over flattened patches; vitkit takes the GEMM")
        for b, c, s, p, w in PATCHES:
            emb = PatchEmbed((p, p), c, w)
            x = torch.randn(b, c, s, s)
            row = {"shape": [b, c, s, p, w], "vitkit": "gemm"}
            for mode in ("train", "inference"):
                if mode == "train":
                    conv = lambda: emb.proj(x).sum().backward()  # noqa: E731
                    gemm = lambda: emb(x).sum().backward()  # noqa: E731
                else:
                    def conv():
                        with torch.inference_mode():
                            emb.proj(x)

                    def gemm():
                        with torch.inference_mode():
                            emb.eval()(x)
                st = median_times({"conv": conv, "gemm": gemm}, args.seconds, args.repeats)
                row[mode] = {"conv_ms": 1e3 * st["conv"], "gemm_ms": 1e3 * st["gemm"], "ratio": st["conv"] / st["gemm"]}
                print(f"  {mode:9s} B{b:<4d} {c}x{s}x{s} patch {p:<3d} width {w:<4d}  "
                      f"conv {1e3 * st['conv']:8.2f}  gemm {1e3 * st['gemm']:8.2f}  "
                      f"vitkit: gemm  {st['conv'] / st['gemm']:5.2f}x the other")
            res["patches"].append(row)
    if "gemm" not in args.skip:
        print("\ninference GEMMs at ViT-B/16 batch-16 shapes: ATen (MKL in fp32) vs oneDNN linear (ops.dense), "
              "GFLOP/s; vitkit: the ViT-B/16 plan's library")
        for dtype in (torch.float32, torch.bfloat16):
            if not ops.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            chosen = planned("B/16", b16, dtype).gemm_for(dtype)
            for m, k, n in GEMMS:
                x, w, bias = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(n).to(dtype)
                fns = {kern: (lambda kern=kern: ops.dense(x, w, bias, kern)) for kern in ops.KERNELS}
                with torch.inference_mode():
                    st = median_times(fns, args.seconds, args.repeats)
                rates = {kern: 2 * m * k * n / s / 1e9 for kern, s in st.items()}
                res["gemm"].append({"dtype": str(dtype), "shape": [m, k, n], "gflops": rates, "vitkit": chosen})
                print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}]  aten {rates['aten']:7.1f}  onednn "
                      f"{rates['onednn']:7.1f}  onednn/aten {rates['onednn'] / rates['aten']:5.2f}  vitkit: {chosen}")
    if "training-gemm" not in args.skip:
        print("\ntraining GEMMs at ViT-S/16 batch-16 shapes: ATen (F.linear and its autograd formula) vs oneDNN's "
              "linear, GFLOP/s")
        for dtype in (torch.float32, torch.bfloat16):
            if not ops.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            for m, k, n in TRAIN_GEMMS:
                x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
                bias, g = torch.randn(n).to(dtype), torch.randn(m, n).to(dtype)
                products = {  # y = x W^T + b; dx = g W; dW = g^T x, by the calls ChosenLinear makes
                    "forward": {kern: (lambda kern=kern: ops._gemm(kern, x, w, bias)) for kern in ops.KERNELS},
                    "grad_input": {kern: (lambda kern=kern: ops._grad_input(kern, g, w)) for kern in ops.KERNELS},
                    "grad_weight": {kern: (lambda kern=kern: ops._grad_weight(kern, g, x)) for kern in ops.KERNELS}}
                winners = []
                for product, fns in products.items():
                    with torch.no_grad():
                        st = median_times(fns, args.seconds, args.repeats)
                    rates = {kern: 2 * m * k * n / s / 1e9 for kern, s in st.items()}
                    winners.append("onednn" if st["onednn"] < st["aten"] else "aten")
                    res["training_gemm"].append({"dtype": str(dtype), "shape": [m, k, n], "product": product,
                                                 "gflops": rates, "ratio": st["onednn"] / st["aten"]})
                    print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}] {product:11s}  aten {rates['aten']:7.1f}  onednn "
                          f"{rates['onednn']:7.1f}  oneDNN {st['aten'] / st['onednn']:5.2f}x ATen's speed")
                if "onednn" in winners:  # the layer (forward + backward) with each product on its winner
                    name = str(dtype)[6:]
                    mix = KernelPlan(training={name: "/".join(winners)}).mix_for(dtype)
                    fns = {"F.linear": lambda: layer_step(None, x, w, bias, g),
                           "winners": lambda: layer_step(mix, x, w, bias, g)}
                    st = median_times(fns, args.seconds, args.repeats)
                    res["training_layer"].append({"dtype": str(dtype), "shape": [m, k, n], "winners": list(mix),
                                                  "f_linear_ms": 1e3 * st["F.linear"],
                                                  "winners_ms": 1e3 * st["winners"],
                                                  "speedup": st["F.linear"] / st["winners"]})
                    print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}] layer fwd+bwd  F.linear "
                          f"{1e3 * st['F.linear']:7.2f} ms  products on {'/'.join(mix)} "
                          f"{1e3 * st['winners']:7.2f} ms"
                          f"  {st['F.linear'] / st['winners']:5.2f}x F.linear's speed")
    if "gelu" not in args.skip:
        print("\nfc1 + GELU at ViT-B/16 batch-16 shape (ops.dense_gelu): the product, then gelu_ in place (ATen) vs "
              "oneDNN's post-op, ms; vitkit: the one the ViT-B/16 plan's GEMM library gives")
        m, k, n = GEMMS[2]
        for dtype in (torch.float32, torch.bfloat16):
            if not ops.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            x, bias = torch.randn(m, k).to(dtype), torch.randn(n).to(dtype)
            w = torch.randn(n, k).mul(k ** -0.5).to(dtype)
            fns = {"separate": lambda: ops.dense_gelu(x, w, bias, "none", "aten"),
                   "fused": lambda: ops.dense_gelu(x, w, bias, "none", "onednn")}
            ours = "fused" if planned("B/16", b16, dtype).gemm_for(dtype) == "onednn" else "separate"
            other = "separate" if ours == "fused" else "fused"
            with torch.inference_mode():
                diff = float((fns["separate"]().float() - fns["fused"]().float()).abs().max())
                st = median_times(fns, args.seconds, args.repeats)
            res.setdefault("gelu", []).append({"dtype": str(dtype), "shape": [m, k, n],
                                               "separate_ms": 1e3 * st["separate"], "fused_ms": 1e3 * st["fused"],
                                               "vitkit": ours, "ratio": st[other] / st[ours],
                                               "max_abs_diff": diff})
            print(f"  {str(dtype)[6:]:9s} separate {1e3 * st['separate']:7.2f}  fused {1e3 * st['fused']:7.2f}  "
                  f"vitkit: {ours}  {st[other] / st[ours]:5.2f}x the other  (max |diff| {diff:.2g})")
    if "chunks" not in args.skip:
        print("\ninference chunk size, one ViT-B/16 block (its plan bound), batch 64 (12608 tokens), fp32 and bf16; "
              "vitkit: chunks of whole images within the plan's chunk_bytes of MLP activations")
        for dtype in (torch.float32, torch.bfloat16):
            kp = planned("B/16", b16, dtype)
            blk = Block(768, 12, 3072).eval().to(dtype)
            bind(blk, kp)
            x = torch.randn(64, 197, 768).to(dtype)
            row = widest_row(b16, dtype)
            ours = kp.images_per_chunk(64, 197, row, x.device)
            fns = {c: (lambda c=c: run_chunks(blk, x, ours if c is None else chunk_images(64, 197, row, c * row)))
                   for c in CHUNKS}
            with torch.inference_mode():
                st = median_times(fns, args.seconds, args.repeats)
            best = min(st.values())
            for c, s in st.items():
                if c is None:
                    label = f"vitkit ({ours} img)"
                else:
                    label = "whole batch" if c == CHUNKS[-1] else f"{c} tokens"
                res["chunks"].append({"dtype": str(dtype), "chunk_tokens": c, "ms": 1e3 * s, "vs_best": s / best,
                                      "vitkit": c is None, "label": label})
                print(f"  {str(dtype)[6:]:9s} {label:16s} {1e3 * s:8.2f} ms  {s / best:5.2f}x the fastest")
    if "readout" not in args.skip:
        res["readout"] = time_readout(args.seconds, args.repeats, spec=args.readout_model)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
