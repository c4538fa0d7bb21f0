"""The benchmark runs: inference throughput, latency and training steps, vitkit and its peers side by side.

Every contender gets the same model configuration (and the same weights where
the peer can hold them), the same input tensor and the same thread count, and
their timed repeats are interleaved. Each row of the result is one
(library, model, resolution, batch, dtype, compile) measurement; the
comparison rows put vitkit's best batch next to each peer's best batch.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.cost import cost
from ..models.inference import inference_summary, prepare_inference, resolve_dtype
from ..models.planner import plan as plan_kernels
from ..timing import alternate, synchronizer
from .gpu import peak_flops
from .models import build_model, clone, example_batch, model_config
from .peers import PEERS, PeerUnavailable, build_peer
from .roofline import roofline


@dataclass
class BenchOptions:
    device: str = "cpu"
    warmup: int = 1
    repeats: int = 5
    peers: List[str] = field(default_factory=lambda: list(PEERS))
    roofline: bool = True
    peer_bf16: str = "weights"  # peers in bf16: bf16 weights (model.to(bf16)) or fp32 weights + autocast
    copy_weights: bool = True
    vitkit_module: bool = False  # also time vitkit's model called directly (no prepare_inference wrapper)
    compile_mode: Optional[str] = None  # torch.compile mode (CUDA: "reduce-overhead" = CUDA graphs)
    overrides: Dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    log: Callable[[str], None] = print

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("log", None)
        return d


@dataclass
class Contender:
    """One library's callable; ``info`` goes into its rows, a callable value read after the timing (what the
    timed calls chose, e.g. the kernels, is known only then)."""

    library: str
    fn: Callable[[torch.Tensor], Any]
    info: Dict[str, Any]
    context: Callable[[], Any] = contextlib.nullcontext


def _freezing(compiled: bool, device: str):
    """Inductor's weight freezing (constant folding, pre-packed CPU GEMM weights) for every compiled
    contender alike; it applies to inference graphs only."""
    if compiled and device == "cpu":
        import torch._inductor.config as inductor_config  # noqa: PLC2701 (torch's only way to set it)

        return inductor_config.patch(freezing=True)
    return contextlib.nullcontext()


def _cast_peer(peer, dtype: torch.dtype, device: str, how: str):
    module = peer.module.to(device)
    if dtype != torch.float32 and how == "weights":
        module = module.to(dtype)
    return module


def _peer_context(dtype: torch.dtype, device: str, how: str) -> Callable[[], Any]:
    if dtype != torch.float32 and how == "autocast":
        return lambda: torch.autocast(device_type=device.split(":")[0], dtype=dtype)
    return contextlib.nullcontext


def inference_contenders(model, dtype: str, compiled: bool, opts: BenchOptions) -> Tuple[List[Contender], List[str]]:
    """vitkit (prepared for inference), optionally vitkit's plain module, and each available peer."""
    dt, dev = resolve_dtype(dtype), opts.device
    notes: List[str] = []
    fast = prepare_inference(clone(model), dt, device=dev, compile=compiled, compile_mode=opts.compile_mode)
    out = [Contender("vitkit", fast, {"engine": lambda: inference_summary(fast), "weights": "reference"})]
    if opts.vitkit_module:
        plain = clone(model).to(device=dev, dtype=dt).eval()
        fn = torch.compile(plain, mode=opts.compile_mode) if compiled else plain
        out.append(Contender("vitkit-module", lambda x, f=fn: f(x.to(dt)), {"engine": "model(x) in eval mode"}))
    for lib in opts.peers:
        if lib in ("onnxruntime", "openvino"):
            why = ("its CPU execution provider is measured in fp32 only" if dt != torch.float32 and lib == "onnxruntime"
                   else "it is its own graph compiler: measured in the eager rows" if compiled else
                   "it runs on the CPU here" if dev != "cpu" else None)
            if why:
                notes.append(f"{lib} not in the {dtype}{' compiled' if compiled else ''} rows: {why}")
                continue
        try:
            peer = build_peer(lib, model, copy_weights=opts.copy_weights,
                              precision="bf16" if dt == torch.bfloat16 else "f32")
        except PeerUnavailable as err:
            notes.append(f"{lib} skipped: {err}")
            continue
        if lib == "openvino":  # fp32 input; its own precision hint, not a cast of the module
            out.append(Contender(peer.label, peer.forward, {"version": peer.version, "weights": peer.weights,
                                                            "precision": peer.module.precision}))
            continue
        module = _cast_peer(peer, dt, dev, opts.peer_bf16)
        if compiled:
            module = torch.compile(module, mode=opts.compile_mode)
        from .peers import forward_fn

        info = {"version": peer.version, "weights": peer.weights,
                "precision": "fp32" if dt == torch.float32 else
                ("bf16 weights" if opts.peer_bf16 == "weights" else "fp32 weights + bf16 autocast")}
        out.append(Contender(peer.label, forward_fn(lib, module), info, _peer_context(dt, dev, opts.peer_bf16)))
    return out, notes


ENGINES = {"ORT": "ratio_ort", "OpenVINO": "ratio_openvino"}  # runtimes of vitkit's export: compared apart


def _row(kind: str, label: str, cfg, img: int, batch: int, dtype: str, compiled: bool, library: str,
         stats, info: Dict[str, Any]) -> Dict[str, Any]:
    c = cost(cfg)
    return {"kind": kind, "model": label, "img_size": img, "batch": batch, "dtype": dtype, "compile": compiled,
            "library": library, "images_per_s": batch / stats.median, "ms_per_batch": 1e3 * stats.median,
            "spread": stats.spread, "gflop_per_image": c.flops / 1e9, "params": c.params,
            "stats": stats.to_dict(), **{k: v() if callable(v) else v for k, v in info.items()}}


def _grid(models: List[str], img_sizes: List[Optional[int]], dtypes: List[str], opts: BenchOptions
          ) -> Iterator[Tuple[str, Any, torch.nn.Module, str]]:
    """(label, config, model, dtype) for every model at every image size and dtype: one model built (with
    the benchmark's seed) per model and size, shared by its dtypes."""
    for spec in models:
        for img in img_sizes:
            label, cfg = model_config(spec, img, opts.overrides)
            base = build_model(cfg, opts.seed)
            for dtype in dtypes:
                yield label, cfg, base, dtype


def _run(kind: str, grid: Iterator[Tuple[str, Any, torch.nn.Module, str]], batches: List[int],
         compiles: List[bool], opts: BenchOptions,
         contenders_for: Callable[[torch.nn.Module, str, bool], Tuple[List[Contender], List[str]]],
         time_batch: Callable[[Any, List[Contender], torch.Tensor, bool], Dict[str, Any]],
         factor: float = 1.0, unit: str = "batch", log_roofline: bool = True) -> Tuple[List[dict], List[str]]:
    """The loop the inference and training runs share. For each (label, config, model, dtype) of ``grid`` and
    each compile setting: the contenders (``contenders_for(model, dtype, compiled)``, freed before the next
    setting), then for each batch size their calls on one input, timed alternated (``time_batch(config,
    contenders, x, compiled)``: stats per library); one row per contender, with the roofline bound (measured
    once per batch size; ``factor``: FLOPs per image over the forward's) and MFU."""
    rows: List[dict] = []
    notes: List[str] = []
    for label, cfg, base, dtype in grid:
        bounds: Dict[int, Any] = {}
        for compiled in compiles:
            contenders, why = contenders_for(base, dtype, compiled)
            notes += [n for n in why if n not in notes]
            for batch in batches:
                x = example_batch(cfg, batch, opts.seed, opts.device)
                opts.log(f"{kind}: {label} {cfg.img_size[0]}px batch {batch} {dtype}"
                         f"{' compiled' if compiled else ''}: {', '.join(c.library for c in contenders)}")
                st = time_batch(cfg, contenders, x, compiled)
                if opts.roofline and batch not in bounds:
                    bounds[batch] = roofline(cfg, batch, dtype, opts.device, progress=log_progress(opts))
                for c in contenders:
                    r = _row(kind, label, cfg, cfg.img_size[0], batch, dtype, compiled, c.library,
                             st[c.library], c.info)
                    _add_bounds(r, bounds.get(batch), opts.device, dtype, factor=factor)
                    rows.append(r)
                    opts.log(f"  {c.library:14s} {r['images_per_s']:9.2f} img/s  "
                             f"{r['ms_per_batch']:9.1f} ms/{unit}  spread {r['spread']:.1%}"
                             + (f"  roofline {r['roofline_fraction']:.0%}"
                                if log_roofline and 'roofline_fraction' in r else ""))
            del contenders
            gc.collect()
    return rows, notes


def run_inference(models: List[str], img_sizes: List[Optional[int]], batches: List[int], dtypes: List[str],
                  compiles: List[bool], opts: BenchOptions, kind: str = "inference") -> Tuple[List[dict], List[str]]:
    """Throughput (or, with batch 1, latency) of every contender for every combination."""
    sync = synchronizer(opts.device)

    def time_batch(cfg, contenders: List[Contender], x: torch.Tensor, compiled: bool) -> Dict[str, Any]:
        cases = {c.library: _inference_case(c, x) for c in contenders}
        with _freezing(compiled, opts.device):
            return alternate(cases, warmup=max(opts.warmup, 1 if compiled else 0), repeats=opts.repeats, sync=sync,
                             min_seconds=0.2 if kind == "latency" else 0)

    return _run(kind, _grid(models, img_sizes, dtypes, opts), batches, compiles, opts,
                lambda model, dtype, compiled: inference_contenders(model, dtype, compiled, opts), time_batch)


def log_progress(opts: BenchOptions) -> Callable[[str], None]:
    return lambda msg: opts.log(f"  roofline: {msg}")


def _inference_case(c: Contender, x: torch.Tensor) -> Callable[[], Any]:
    def call():
        with torch.inference_mode(), c.context():
            return c.fn(x)
    return call


def _add_bounds(row: Dict[str, Any], bound, device: str, dtype: str, factor: float = 1.0) -> None:
    """Roofline fraction (CPU and GPU) and model FLOP utilisation against the device's peak (GPU)."""
    if bound is not None:
        row["roofline_images_per_s"] = bound.images_per_s / factor
        row["roofline_fraction"] = bound.fraction(row["images_per_s"]) * factor
        row["roofline_gemm_gflops"] = bound.gflop_per_image / bound.seconds_per_image
    if device.startswith("cuda"):
        peak, source = peak_flops(dtype, device)
        if peak:
            row["mfu"] = factor * row["gflop_per_image"] * 1e9 * row["images_per_s"] / peak
            row["peak_tflops"] = peak / 1e12
            row["peak_source"] = source


# --- training -------------------------------------------------------------------------------
def _vitkit_train_step(model, dtype: str, device: str) -> Tuple[Callable, str, bool]:
    """vitkit's training step: the training engine's TrainStep with its fused AdamW when available."""
    from ..train import TrainStep, build_optimizer  # imported here: vitkit.train imports the model stack
    from ..train.recipe import OptimConfig

    opt = build_optimizer(model, OptimConfig(name="adamw", lr=1e-4, weight_decay=0.05), torch.device(device))
    fused = bool(opt.defaults.get("fused"))  # the engine's "auto": fused where torch has it, else foreach
    step = TrainStep(model, opt, precision=dtype, clip_grad=1.0)
    impl = "fused" if fused else "foreach"
    return step, f"vitkit.train.TrainStep ({impl} AdamW, no-decay groups, clip 1.0, {dtype})", fused


def _minimal_step(model, opt, dtype: str, device: str) -> Callable:
    params = [p for p in model.parameters() if p.requires_grad]

    def step(x, t):
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def training_contenders(model, dtype: str, compiled: bool, opts: BenchOptions
                        ) -> Tuple[List[Tuple[str, Callable, Dict[str, Any]]], List[str]]:
    dev = opts.device
    notes: List[str] = []
    mine = clone(model).to(dev).train()
    mine.set_kernel_plan(plan_kernels(mine.config, resolve_dtype(dtype), dev))  # as the trainer's set-up does
    if compiled:
        mine = torch.compile(mine, mode=opts.compile_mode)
    step, how, fused = _vitkit_train_step(mine, dtype, dev)
    out = [("vitkit", step, {"step": how, "optimizer": f"torch.optim.AdamW({'fused' if fused else 'foreach'})"})]
    if "timm" in opts.peers:
        try:
            peer = build_peer("timm", model, copy_weights=opts.copy_weights, check=False)
            module = peer.module.to(dev).train()
            if compiled:
                module = torch.compile(module, mode=opts.compile_mode)
            # the same optimiser implementation as vitkit's step (fused AdamW where torch has it, else
            # foreach), the same decay / no-decay split (no decay for biases, norms, tokens, positions):
            # the comparison measures the model code, not the optimiser
            named = [(n, p) for n, p in peer.module.named_parameters() if p.requires_grad]
            skip = lambda n, p: p.ndim <= 1 or n.split(".")[-1] in ("cls_token", "dist_token", "pos_embed")  # noqa: E731
            groups = [{"params": [p for n, p in named if not skip(n, p)], "weight_decay": 0.05},
                      {"params": [p for n, p in named if skip(n, p)], "weight_decay": 0.0}]
            kw = {"fused": True} if fused else {"foreach": True}
            opt = torch.optim.AdamW(groups, lr=1e-4, **kw)
            out.append(("timm", _minimal_step(module, opt, dtype, dev),
                        {"step": f"plain PyTorch loop (same AdamW implementation, clip 1.0, "
                                 f"{'bf16 autocast' if dtype == 'bf16' else 'fp32'})", "version": peer.version,
                         "optimizer": f"torch.optim.AdamW({'fused' if fused else 'foreach'})"}))
        except PeerUnavailable as err:
            notes.append(f"timm skipped: {err}")
    if [p for p in opts.peers if p != "timm"]:
        notes.append("training steps are compared with timm only (the training target's reference)")
    return out, notes


TRAIN_COMPILED_WARMUP = 3  # untimed steps of a compiled training step before its timed rounds


def run_training(models: List[str], img_sizes: List[Optional[int]], batches: List[int], dtypes: List[str],
                 compiles: List[bool], opts: BenchOptions) -> Tuple[List[dict], List[str]]:
    """Optimiser steps per second (x batch = images/s) for vitkit and timm, alternated."""
    sync = synchronizer(opts.device)

    def grid():
        for label, cfg, base, dtype in _grid(models, img_sizes, dtypes, opts):
            if dtype not in ("fp32", "bf16"):
                raise ConfigError(f"training precision {dtype!r}: use fp32 or bf16 (autocast)")
            yield label, cfg, base, dtype

    def contenders_for(model, dtype: str, compiled: bool) -> Tuple[List[Contender], List[str]]:
        steps, notes = training_contenders(model, dtype, compiled, opts)
        return [Contender(name, step, info) for name, step, info in steps], notes

    def time_batch(cfg, contenders: List[Contender], x: torch.Tensor, compiled: bool) -> Dict[str, Any]:
        t = torch.randint(0, max(cfg.num_classes, 1), (x.shape[0],),
                          generator=torch.Generator().manual_seed(opts.seed)).to(opts.device)
        cases = {c.library: (lambda s=c.fn: s(x, t)) for c in contenders}
        # a compiled step can recompile on its first calls (after the first backward and optimiser step), each
        # recompile seconds long: three untimed steps keep them out of the timed rounds (a compiled S/16 fp32
        # run with one had spreads near 40% and a third of the step rate)
        return alternate(cases, warmup=max(opts.warmup, TRAIN_COMPILED_WARMUP if compiled else 1),
                         repeats=opts.repeats, sync=sync)

    # forward + backward ~ 3x the forward GEMMs (backward: two products per forward one)
    return _run("train", grid(), batches, compiles, opts, contenders_for, time_batch, factor=3.0, unit="step",
                log_roofline=False)


# --- comparisons ------------------------------------------------------------------------------
def compare(rows: List[dict]) -> List[dict]:
    """For each (kind, model, size, dtype, compile): each library's best batch, and vitkit / best peer.

    Throughput and training: images/s (higher is better). Latency: ms at batch 1 (lower is better, the
    ratio is peer time / vitkit time). Memory: peak MiB (lower is better, ratio vitkit / best peer)."""
    groups: Dict[tuple, Dict[str, dict]] = {}
    for r in rows:
        key = (r["kind"], r["model"], r["img_size"], r["dtype"], r.get("compile", False))
        best = groups.setdefault(key, {})
        lib = r["library"]
        if r["kind"] == "memory":
            better = lib not in best or r["peak_mib"] < best[lib]["peak_mib"]
        else:
            better = lib not in best or r["images_per_s"] > best[lib]["images_per_s"]
        if better:
            best[lib] = r
    out = []
    for (kind, model, img, dtype, compiled), libs in groups.items():
        mine = libs.get("vitkit")
        # the best *library* peer (timm / HF / torchvision); the engines (ONNX Runtime, OpenVINO) get their own
        peers = {k: v for k, v in libs.items() if k not in ("vitkit", "vitkit-module", *ENGINES)}
        entry = {"kind": kind, "model": model, "img_size": img, "dtype": dtype, "compile": compiled,
                 "libraries": {k: _headline(v) for k, v in libs.items()}}
        for engine, key in ENGINES.items():
            if mine and engine in libs and kind != "memory":
                entry[key] = mine["images_per_s"] / libs[engine]["images_per_s"]
        if mine and peers:
            if kind == "memory":
                best_peer = min(peers.values(), key=lambda v: v["peak_mib"])
                entry["ratio"] = mine["peak_mib"] / best_peer["peak_mib"]
            else:
                best_peer = max(peers.values(), key=lambda v: v["images_per_s"])
                entry["ratio"] = mine["images_per_s"] / best_peer["images_per_s"]
            entry["best_peer"] = best_peer["library"]
        if mine and "roofline_fraction" in mine:
            entry["roofline_fraction"] = mine["roofline_fraction"]
        if mine and "mfu" in mine:
            entry["mfu"] = mine["mfu"]
        out.append(entry)
    return out


def _headline(r: dict) -> dict:
    if r["kind"] == "memory":
        return {"batch": r["batch"], "peak_mib": r["peak_mib"]}
    return {"batch": r["batch"], "images_per_s": r["images_per_s"], "ms_per_batch": r["ms_per_batch"],
            "spread": r["spread"]}
