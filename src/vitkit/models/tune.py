"""The GEMM libraries of a model's encoder, chosen by timing encoder blocks of the model's shape.

A dense layer timed alone (:func:`kernels.measure`) can misjudge what each library does inside the model:
inside, every layer has its own weights (cold in the caches), the products run beside LayerNorm, attention and
the residual adds, and oneDNN fuses the MLP's GELU into its first product. So under ``gemm=auto`` the GEMMs of a
:class:`~vitkit.models.vit.VisionTransformer` in inference (evaluation mode, no autograd) run on the library that
runs :data:`DEPTH` encoder blocks of the model's width, heads, MLP size and token count faster, on the chunk of
images the model runs at a time (each block with its own random weights; both libraries in alternating rounds,
:func:`backend.paired_rounds`). oneDNN is taken when its median paired speed-up reaches :data:`MIN_GAIN`. The
choice is cached per CPU, torch build, thread count and shape (:mod:`vitkit.models.backend`), recorded in
:func:`backend.decisions`, and a declared ``gemm`` skips the measurement.

In training (autograd on) the same holds for the three products of every dense layer (forward, input gradient,
weight gradient): :func:`encoder_training_gemms` times :data:`TRAINING_DEPTH` block(s) of the model's shape,
forward + backward on :data:`TRAINING_IMAGES` images (fp32, or bf16 under autocast as the trainer runs it), with
``F.linear`` and with each mix in :data:`TRAINING_MIXES`, and takes the fastest mix when its median paired
speed-up over ``F.linear`` reaches :data:`MIN_GAIN`. The mixes are the ones a product-level measurement found
worth trying on the machine kinds measured: all three on oneDNN (AMD EPYC Zen 5, fp32), the weight gradient
back on ATen (AMD EPYC Zen 4, fp32: oneDNN's weight gradient is slow on tall-skinny reductions), and only the
forward product on oneDNN (bf16 on the AVX512-BF16 kinds).
"""
from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from . import backend, kernels
from .layers import Block, chunk_images
from .precision import product_dtype

DEPTH = 3  # blocks per timed call: distinct weights, as in a model
TIMING_BATCH = 16  # the blocks run on the chunk of images a batch of this many runs in (the model's chunking)
ROUNDS = 5
MIN_GAIN = 1.03  # oneDNN must run the blocks >= 3% faster (median paired round) to be chosen
TRAINING_MIXES = (("onednn", "onednn", "onednn"), ("onednn", "onednn", "aten"), ("onednn", "aten", "aten"))
TRAINING_IMAGES = 16  # images per timed training call: fixed, so one choice per run (a last partial batch too)
TRAINING_DEPTH = 1
_CHOICE: Dict[Tuple, str] = {}  # inference: library; training: mix name


def forget() -> None:
    """Drop this process's encoder GEMM choices (:func:`vitkit.models.backend.forget` calls it)."""
    _CHOICE.clear()


backend.on_forget(forget)


def encoder_what(dtype: torch.dtype, width: int, heads: int, mlp_dim: int, tokens: int, images: int,
                 gelu: str, mode: str = "inference") -> str:
    """The name of an encoder's GEMM choice in ``mode`` (inference or training): its decision's and cache
    entry's key."""
    return (f"gemm encoder {str(dtype).replace('torch.', '')}{' training' if mode == 'training' else ''} "
            f"width={width} heads={heads} mlp={mlp_dim} tokens={tokens} images={images} gelu={gelu}")


def training_what(dtype: torch.dtype, width: int, heads: int, mlp_dim: int, tokens: int, images: int,
                  gelu: str) -> str:
    """The name of an encoder's training GEMM choice (:func:`encoder_what` in training)."""
    return encoder_what(dtype, width, heads, mlp_dim, tokens, images, gelu, mode="training")


def widest_row(config, dtype: torch.dtype) -> int:
    """Bytes per token of an encoder block's largest temporary (the MLP's hidden row or the qkv row): what
    sizes the inference chunks (:func:`~vitkit.models.layers.chunk_images`)."""
    return max(config.mlp_dim, 3 * config.width) * dtype.itemsize


def encoder_shape(config, dtype: torch.dtype) -> Tuple:
    """(width, heads, MLP size, tokens, images, gelu) of a model's encoder as :func:`encoder_gemm` times it."""
    tokens = config.num_patches + config.num_prefix_tokens
    return _shape(config, tokens, chunk_images(TIMING_BATCH, tokens, widest_row(config, dtype)))


def _shape(config, tokens: int, images: int) -> Tuple:
    return config.width, config.num_heads, config.mlp_dim, tokens, images, config.gelu


def measure_blocks(dtype: torch.dtype, width: int, heads: int, mlp_dim: int, tokens: int, images: int,
                   gelu: str = "exact", rounds: int = ROUNDS, depth: int = DEPTH) -> dict:
    """Time ``depth`` fresh encoder blocks of this shape on ``images`` x ``tokens`` tokens with each GEMM library;
    per-library median seconds and the median paired ratio aten / onednn (> 1: oneDNN faster)."""
    with torch.random.fork_rng(devices=[]):  # the blocks' initialisation leaves the caller's RNG alone
        torch.manual_seed(0)
        blocks = [Block(width, heads, mlp_dim, gelu=gelu).eval().to(dtype) for _ in range(depth)]
        x = torch.randn(images, tokens, width).to(dtype)

    def run(kernel: str) -> None:
        with kernels.inference_gemms(kernel):
            y = x
            for block in blocks:
                y = block(y)[0]

    times = backend.paired_rounds({k: (lambda k=k: run(k)) for k in kernels.KERNELS}, rounds)
    return {"aten_s": times.median("aten"), "onednn_s": times.median("onednn"), "ratio": times.ratio("aten", "onednn"),
            "rounds": rounds, "depth": depth, "cpu_wait": times.cpu_wait,
            "shape": {"width": width, "heads": heads, "mlp": mlp_dim, "tokens": tokens, "images": images}}


def encoder_gemm(dtype: torch.dtype, device: torch.device, width: int, heads: int, mlp_dim: int, tokens: int,
                 images: int, gelu: str = "exact") -> Optional[str]:
    """The GEMM library for an encoder of this shape in inference: the declared one, or under ``auto`` the cached
    (or, the first time, a fresh) block timing; None where only ATen runs (off the CPU, a dtype oneDNN cannot
    run, a graph consumer watching), so each product takes :func:`kernels.gemm_kernel`'s own answer."""
    if device.type != "cpu" or backend.graph_capture() or not kernels.onednn_ok(dtype):
        return None
    declared = backend.current().gemm
    if declared != "auto":
        return declared
    shape = (dtype, width, heads, mlp_dim, tokens, images, gelu)
    return _decide("inference", shape, kernels.KERNELS, measure_blocks, "onednn")


def _decide(mode: str, shape: tuple, allowed, measure, best) -> str:
    """This process's, the cache's or (the first time) a fresh measurement's choice for an encoder of ``shape``
    (dtype, width, heads, mlp, tokens, images, gelu) in ``mode``: ``best`` (a name, or ``"best"``: the result's
    best candidate) where the measured ratio reaches :data:`MIN_GAIN`, else ``aten``."""
    key = (mode, *shape, torch.get_num_threads())
    if key not in _CHOICE:
        what = encoder_what(*shape, mode=mode)
        choice = backend.cached_choice(what, allowed)
        if choice is None:
            result = measure(*shape)
            winner = result["best"] if best == "best" else best
            choice = backend.remember(what, {**result, "min_gain": MIN_GAIN},
                                      winner if result["ratio"] >= MIN_GAIN else "aten")
        _CHOICE[key] = choice
    return _CHOICE[key]


def training_shape(config) -> Tuple:
    """(width, heads, MLP size, tokens, images, gelu) of a model's encoder as :func:`encoder_training_gemms`
    times it: the configured token count (whatever patch dropout or masking leaves), :data:`TRAINING_IMAGES`."""
    return _shape(config, config.num_patches + config.num_prefix_tokens, TRAINING_IMAGES)


def measure_training_blocks(dtype: torch.dtype, width: int, heads: int, mlp_dim: int, tokens: int, images: int,
                            gelu: str = "exact", rounds: int = ROUNDS, depth: int = TRAINING_DEPTH,
                            mixes=TRAINING_MIXES) -> dict:
    """Time a training step's forward + backward through ``depth`` fresh encoder blocks of this shape with
    ``F.linear`` ("aten") and each mix of libraries; per candidate median seconds and median paired ratio
    aten / candidate (> 1: the mix faster). bf16 runs fp32 blocks under CPU autocast, as the trainer does."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        blocks = [Block(width, heads, mlp_dim, gelu=gelu).train() for _ in range(depth)]
        x = torch.randn(images, tokens, width)
        grad = torch.randn(images, tokens, width)
    params = [p for b in blocks for p in b.parameters()]
    autocast = dtype != torch.float32

    def run(mix) -> None:
        leaf = x.detach().requires_grad_()
        with kernels.training_gemms(dtype, mix), torch.autocast("cpu", dtype=dtype, enabled=autocast):
            y = leaf
            for block in blocks:
                y = block(y)[0]
        y.float().backward(grad)
        for p in params:
            p.grad = None

    fns = {kernels.mix_name(m): (lambda m=m: run(m)) for m in (None,) + tuple(mixes)}
    times = backend.paired_rounds(fns, rounds, autograd=True)
    out = {"aten_s": times.median("aten"), "rounds": rounds, "depth": depth, "mixes": {},
           "cpu_wait": times.cpu_wait,
           "shape": {"width": width, "heads": heads, "mlp": mlp_dim, "tokens": tokens, "images": images}}
    for name in list(fns)[1:]:
        out["mixes"][name] = {"s": times.median(name), "ratio": times.ratio("aten", name)}
    best = max(out["mixes"], key=lambda n: out["mixes"][n]["ratio"])
    out["best"], out["ratio"] = best, out["mixes"][best]["ratio"]
    return out


def encoder_training_gemms(dtype: torch.dtype, device: torch.device, width: int, heads: int, mlp_dim: int,
                           tokens: int, images: int, gelu: str = "exact") -> Optional[Tuple[str, ...]]:
    """The libraries of the dense layers' (forward, input gradient, weight gradient) products for an encoder of
    this shape in training: None (``F.linear``) off the CPU, for a dtype oneDNN cannot run, under a graph
    consumer, with ``gemm=aten`` or where no mix won; with ``gemm=onednn`` all three on oneDNN; under ``auto``
    the cached (or, the first time, a fresh) block timing."""
    if device.type != "cpu" or backend.graph_capture() or not kernels.onednn_ok(dtype):
        return None
    declared = backend.current().gemm
    if declared != "auto":
        return None if declared == "aten" else ("onednn",) * 3
    names = ["aten"] + [kernels.mix_name(m) for m in TRAINING_MIXES]
    return kernels.parse_mix(_decide("training", (dtype, width, heads, mlp_dim, tokens, images, gelu), names,
                                     measure_training_blocks, "best"))


def training_gemms_of(config, x: torch.Tensor, blocks: nn.Module) -> Optional[tuple]:
    """(dtype, mix) of the training products in an encoder of ``config``'s shape running ``blocks`` on ``x``
    (:func:`encoder_training_gemms`), or None where no autograd graph is recorded through them."""
    if x.device.type != "cpu" or not torch.is_grad_enabled() or backend.graph_capture() or not (
            x.requires_grad or any(p.requires_grad for p in blocks.parameters())):
        return None
    dtype = product_dtype(x)
    return dtype, encoder_training_gemms(dtype, x.device, *training_shape(config))


def block_on(blk: nn.Module, gemms: Optional[tuple], x: torch.Tensor, bias: Optional[torch.Tensor],
             need_weights: bool = False, **kw):
    """One encoder block with its training products on ``gemms`` ((dtype, mix) or None: each layer's default);
    a function of its own so that gradient checkpointing recomputes the block on the same products."""
    with kernels.training_gemms(*gemms) if gemms is not None else contextlib.nullcontext():
        return blk(x, bias, need_weights, **kw)
