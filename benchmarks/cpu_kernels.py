"""CPU kernel choices of the model, measured; writes benchmarks/results/<machine kind>/cpu_kernels.json.

Each choice is timed both ways in the same process, alternating, median of ``--repeats`` windows:

- attention: each path of ``precision.attention`` - torch's fused kernel, the explicit softmax(QK^T/sqrt(d))V,
  and for bf16 the fused kernel on operands widened to fp32 - on q/k/v laid out as the model has them (strided
  views of the qkv projection's rows), fp32 and bf16, forward + backward (training) and forward only
  (inference); vitkit's choice is ``precision.attention_path`` under the declared backend (``auto``: its own
  short measurement at that shape, cached; bf16 widened to fp32 where bf16 GEMMs are not native);
- patch embedding: the stride-P convolution vs one GEMM over flattened patches (vitkit's only path),
  training (forward + backward) and inference;
- GEMM kernel of the inference products: ATen (``addmm``: MKL in fp32) vs oneDNN's linear
  (``torch.ops.mkldnn._linear_pointwise``), fp32 and bf16, at ViT-B/16's shapes (vitkit picks per machine
  by :mod:`vitkit.models.kernels`' calibration; this is the wider table behind it);
- GEMM library of the training products (forward with bias, gradient of the input, gradient of the weight)
  at ViT-S/16's shapes, ATen vs oneDNN's linear on the operands as autograd has them (transposed views),
  and where oneDNN wins a product, the dense layer's forward + backward with each product on its winner
  (``kernels.ChosenLinear``) against ``F.linear``'s, layer by layer (vitkit's training choice times whole
  encoder blocks of the model's shape with each mix: :func:`vitkit.models.tune.encoder_training_gemms`);
- GELU after the first MLP product: vitkit's product then ``gelu_`` in place vs oneDNN's linear with GELU as
  its post-op (one pass over the hidden activations instead of two), fp32 and bf16;
- the inference chunk size of one ViT-B/16 block at batch 64: vitkit's rule (chunks of whole images whose
  largest temporary stays within ``INFERENCE_CHUNK_BYTES``) vs fixed token counts and the whole batch;
- the last block for the read-out rows: ViT-B/16's logits at batch 16 as ``model(x)`` computes them in
  inference (the last block for the class token only, :mod:`vitkit.models.readout`) vs the same model over
  every token (``forward_head(forward_features(x))``), fp32 and bf16, with the largest logit difference.

A ratio > 1 means the path vitkit takes is faster::

    .venv/bin/python benchmarks/cpu_kernels.py            # both cores
    .venv/bin/python benchmarks/cpu_kernels.py --threads 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from vitkit.bench.machine import machine_info, machine_line
from vitkit.models import backend, kernels, precision
from vitkit.models.layers import INFERENCE_CHUNK_BYTES, Block, PatchEmbed, chunk_images, merge_heads, split_heads

ATTENTION = [  # batch, heads, tokens, head dim
    (100, 4, 49, 16), (256, 4, 16, 32), (64, 4, 65, 32), (16, 6, 197, 64), (16, 12, 197, 64), (8, 12, 577, 64)]
PATCHES = [  # batch, channels, image size, patch, width
    (64, 1, 28, 4, 64), (128, 1, 28, 7, 128), (128, 3, 32, 4, 192), (64, 3, 64, 8, 384), (32, 3, 224, 16, 768)]
GEMMS = [  # rows, in, out: ViT-B/16 at batch 16 (3152 tokens) - qkv, proj, fc1, fc2
    (3152, 768, 2304), (3152, 768, 768), (3152, 768, 3072), (3152, 3072, 768)]
TRAIN_GEMMS = [  # rows, in, out: ViT-S/16 at batch 16 (3152 tokens) - qkv, proj, fc1, fc2
    (3152, 384, 1152), (3152, 384, 384), (3152, 384, 1536), (3152, 1536, 384)]
CHUNKS = [None, 2048, 4096, 8192, 1 << 30]  # None: vitkit's rule (INFERENCE_CHUNK_BYTES per chunk)


def alternate(fns: dict, seconds: float, repeats: int) -> dict:
    """Median seconds per call of each function, windows of ``seconds`` taken in rotating order."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            n, t0 = 0, time.perf_counter()
            while True:
                fns[k]()
                n += 1
                if time.perf_counter() - t0 >= seconds:
                    break
            times[k].append((time.perf_counter() - t0) / n)
    return {k: statistics.median(v) for k, v in times.items()}


def run_chunks(blk: Block, x: torch.Tensor, per: int) -> torch.Tensor:
    """The block on chunks of ``per`` whole images, as the model's forward_features runs its encoder."""
    return torch.cat([blk(c)[0] for c in x.split(per)])


def time_readout(seconds: float, repeats: int, batch: int = 16, spec: str = "B/16") -> list:
    """A model's logits in inference: the last block for the read-out rows (vitkit) vs over every token."""
    from vitkit.bench.models import build_model, example_batch, model_config

    print(f"\nlast block for the read-out rows, {spec} logits at batch {batch}: model(x) (the class token's row "
          f"only) vs forward_head(forward_features(x)) (every token)")
    out = []
    cfg = model_config(spec)[1]
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(cfg).to(dtype)
        x = example_batch(cfg, batch).to(dtype)
        fns = {"readout": lambda: model(x), "every_token": lambda: model.forward_head(model.forward_features(x))}
        with torch.inference_mode():
            diff = (fns["readout"]().float() - fns["every_token"]().float()).abs().max().item()
            st = alternate(fns, seconds, repeats)
        ratio = st["every_token"] / st["readout"]
        out.append({"model": spec, "dtype": str(dtype), "batch": batch, "rows": model.readout_rows(),
                    "readout_ms": 1e3 * st["readout"], "every_token_ms": 1e3 * st["every_token"], "ratio": ratio,
                    "readout_images_per_s": batch / st["readout"],
                    "every_token_images_per_s": batch / st["every_token"], "max_abs_diff": diff})
        print(f"  {str(dtype)[6:]:9s} read-out rows {1e3 * st['readout']:8.1f} ms  every token "
              f"{1e3 * st['every_token']:8.1f} ms  vitkit: read-out {ratio:5.2f}x the other  (max |diff| {diff:.2g})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=0.5, help="per timing window")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/<machine kind>/cpu_kernels.json)")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["attention", "patches", "gemm", "training-gemm", "gelu", "chunks", "readout"])
    ap.add_argument("--readout-model", default="B/16", help="the model of the readout rows")
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
    res = {"machine": info, "machine_line": line, "command": "python " + " ".join(sys.argv),
           "attention": [], "patches": [], "gemm": [], "training_gemm": [], "training_layer": [], "chunks": []}
    if "attention" not in args.skip:
        print(f"\nattention in the model's layout (q/k/v views of the qkv rows, output back to token rows), by each "
              f"path of precision.attention: fused kernel, explicit softmax(QK^T)V, and for bf16 the fused kernel "
              f"on operands widened to fp32; vitkit's choice is precision.attention_path ({backend.current().spec}: "
              f"auto measures each shape once)")
        for dtype in (torch.float32, torch.bfloat16):
            paths = [p for p in precision.ATTENTION_PATHS if p != "widened" or dtype == torch.bfloat16]
            for b, h, t, d in ATTENTION:
                qkv = torch.randn(b * t, 3 * h * d).to(dtype).requires_grad_()
                g = torch.randn(b * t, h * d).to(dtype)
                row = {"shape": [b, h, t, d], "dtype": str(dtype)}
                for mode in ("train", "inference"):
                    def run(path, mode=mode):
                        def call():
                            with torch.inference_mode(mode == "inference"):
                                out = merge_heads(precision.attention(*split_heads(qkv, b, t, h, d), path=path))
                                if mode == "train":
                                    out.backward(g)
                                    qkv.grad = None
                        return call
                    with torch.inference_mode(mode == "inference"):
                        ours = precision.attention_path(*split_heads(qkv, b, t, h, d))
                    st = alternate({p: run(p) for p in paths}, args.seconds, args.repeats)
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
                st = alternate({"conv": conv, "gemm": gemm}, args.seconds, args.repeats)
                row[mode] = {"conv_ms": 1e3 * st["conv"], "gemm_ms": 1e3 * st["gemm"], "ratio": st["conv"] / st["gemm"]}
                print(f"  {mode:9s} B{b:<4d} {c}x{s}x{s} patch {p:<3d} width {w:<4d}  "
                      f"conv {1e3 * st['conv']:8.2f}  gemm {1e3 * st['gemm']:8.2f}  "
                      f"vitkit: gemm  {st['conv'] / st['gemm']:5.2f}x the other")
            res["patches"].append(row)
    if "gemm" not in args.skip:
        print("\ninference GEMMs at ViT-B/16 batch-16 shapes: ATen (MKL in fp32) vs oneDNN linear, GFLOP/s")
        for dtype in (torch.float32, torch.bfloat16):
            if not kernels.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            chosen = kernels.gemm_kernel(dtype, torch.device("cpu"))
            for m, k, n in GEMMS:
                x, w, bias = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(n).to(dtype)
                fns = {kern: (lambda kern=kern: kernels._gemm(kern, x, w, bias)) for kern in kernels.KERNELS}
                with torch.inference_mode():
                    st = alternate(fns, args.seconds, args.repeats)
                rates = {kern: 2 * m * k * n / s / 1e9 for kern, s in st.items()}
                res["gemm"].append({"dtype": str(dtype), "shape": [m, k, n], "gflops": rates, "vitkit": chosen})
                print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}]  aten {rates['aten']:7.1f}  onednn "
                      f"{rates['onednn']:7.1f}  onednn/aten {rates['onednn'] / rates['aten']:5.2f}  vitkit: {chosen}")
    if "training-gemm" not in args.skip:
        print("\ntraining GEMMs at ViT-S/16 batch-16 shapes: ATen (vitkit's training path: F.linear and its autograd "
              "formula) vs oneDNN's linear, GFLOP/s")
        for dtype in (torch.float32, torch.bfloat16):
            if not kernels.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            for m, k, n in TRAIN_GEMMS:
                x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
                bias, g = torch.randn(n).to(dtype), torch.randn(m, n).to(dtype)
                products = {  # y = x W^T + b; dx = g W; dW = g^T x, by the model's own kernel calls
                    "forward": {kern: (lambda kern=kern: kernels._gemm(kern, x, w, bias)) for kern in kernels.KERNELS},
                    "grad_input": {kern: (lambda kern=kern: kernels._grad_input(kern, g, w))
                                   for kern in kernels.KERNELS},
                    "grad_weight": {kern: (lambda kern=kern: kernels._grad_weight(kern, g, x))
                                    for kern in kernels.KERNELS}}
                winners = []
                for product, fns in products.items():
                    with torch.no_grad():
                        st = alternate(fns, args.seconds, args.repeats)
                    rates = {kern: 2 * m * k * n / s / 1e9 for kern, s in st.items()}
                    winners.append("onednn" if st["onednn"] < st["aten"] else "aten")
                    res["training_gemm"].append({"dtype": str(dtype), "shape": [m, k, n], "product": product,
                                                 "gflops": rates, "ratio": st["onednn"] / st["aten"]})
                    print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}] {product:11s}  aten {rates['aten']:7.1f}  onednn "
                          f"{rates['onednn']:7.1f}  oneDNN {st['aten'] / st['onednn']:5.2f}x ATen's speed")
                if "onednn" in winners:  # the layer (forward + backward) with each product on its winner
                    chosen = tuple(winners)
                    fns = {"F.linear": lambda: kernels.layer_step(None, x, w, bias, g),
                           "winners": lambda: kernels.layer_step(chosen, x, w, bias, g)}
                    st = alternate(fns, args.seconds, args.repeats)
                    res["training_layer"].append({"dtype": str(dtype), "shape": [m, k, n], "winners": list(chosen),
                                                  "f_linear_ms": 1e3 * st["F.linear"],
                                                  "winners_ms": 1e3 * st["winners"],
                                                  "speedup": st["F.linear"] / st["winners"]})
                    print(f"  {str(dtype)[6:]:9s} [{m}x{k}]x[{k}x{n}] layer fwd+bwd  F.linear "
                          f"{1e3 * st['F.linear']:7.2f} ms  products on {'/'.join(chosen)} "
                          f"{1e3 * st['winners']:7.2f} ms"
                          f"  {st['F.linear'] / st['winners']:5.2f}x F.linear's speed")
    if "gelu" not in args.skip:
        print("\nfc1 + GELU at ViT-B/16 batch-16 shape: vitkit (product, then gelu_ in place) vs oneDNN post-op, ms")
        m, k, n = GEMMS[2]
        for dtype in (torch.float32, torch.bfloat16):
            if not kernels.onednn_ok(dtype):
                print(f"  {dtype}: oneDNN's linear does not run here")
                continue
            x, bias = torch.randn(m, k).to(dtype), torch.randn(n).to(dtype)
            w = torch.randn(n, k).mul(k ** -0.5).to(dtype)
            fns = {"separate": lambda: torch.ops.aten.gelu_(precision.dense(x, w, bias)),
                   "fused": lambda: torch.ops.mkldnn._linear_pointwise(x, w, bias, "gelu", [], "none")}
            with torch.inference_mode():
                diff = float((fns["separate"]().float() - fns["fused"]().float()).abs().max())
                st = alternate(fns, args.seconds, args.repeats)
            res.setdefault("gelu", []).append({"dtype": str(dtype), "shape": [m, k, n],
                                               "separate_ms": 1e3 * st["separate"],
                                               "fused_ms": 1e3 * st["fused"], "ratio": st["fused"] / st["separate"],
                                               "max_abs_diff": diff})
            print(f"  {str(dtype)[6:]:9s} separate {1e3 * st['separate']:7.2f}  fused {1e3 * st['fused']:7.2f}  "
                  f"vitkit: separate  {st['fused'] / st['separate']:5.2f}x the other  (max |diff| {diff:.2g})")
    if "chunks" not in args.skip:
        print(f"\ninference chunk size, one ViT-B/16 block, batch 64 (12608 tokens), fp32 and bf16; vitkit: chunks "
              f"of whole images with at most {INFERENCE_CHUNK_BYTES >> 20} MiB of MLP activations")
        for dtype in (torch.float32, torch.bfloat16):
            blk = Block(768, 12, 3072).eval().to(dtype)
            x = torch.randn(64, 197, 768).to(dtype)
            fns = {c: (lambda c=c: run_chunks(blk, x, chunk_images(64, 197, 3072 * x.element_size(), c)))
                   for c in CHUNKS}
            with torch.inference_mode():
                st = alternate(fns, args.seconds, args.repeats)
            best = min(st.values())
            for c, s in st.items():
                if c is None:
                    label = f"vitkit ({chunk_images(64, 197, 3072 * x.element_size())} img)"
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
