"""The inference GEMM library of a model's encoder, chosen by timing encoder blocks of the model's shape.

A dense layer timed alone (:func:`kernels.measure`) can misjudge what each library does inside the model:
inside, every layer has its own weights (cold in the caches), the products run beside LayerNorm, attention and
the residual adds, and oneDNN fuses the MLP's GELU into its first product. So under ``gemm=auto`` the GEMMs of a
:class:`~vitkit.models.vit.VisionTransformer` in inference (evaluation mode, no autograd) run on the library that
runs :data:`DEPTH` encoder blocks of the model's width, heads, MLP size and token count faster, on the chunk of
images the model runs at a time (each block with its own random weights; both libraries in alternating rounds,
:func:`backend.paired_rounds`). oneDNN is taken when its median paired speed-up reaches :data:`MIN_GAIN`. The
choice is cached per CPU, torch build, thread count and shape (:mod:`vitkit.models.backend`), recorded in
:func:`backend.decisions`, and a declared ``gemm`` skips the measurement.
"""
from __future__ import annotations

import statistics
from typing import Dict, Optional, Tuple

import torch

from . import backend, kernels
from .layers import Block, chunk_images

DEPTH = 3  # blocks per timed call: distinct weights, as in a model
TIMING_BATCH = 16  # the blocks run on the chunk of images a batch of this many runs in (the model's chunking)
ROUNDS = 5
MIN_GAIN = 1.03  # oneDNN must run the blocks >= 3% faster (median paired round) to be chosen
_CHOICE: Dict[Tuple, str] = {}


def forget() -> None:
    """Drop this process's encoder GEMM choices (:func:`vitkit.models.backend.forget` calls it)."""
    _CHOICE.clear()


backend.on_forget(forget)


def encoder_what(dtype: torch.dtype, width: int, heads: int, mlp_dim: int, tokens: int, images: int,
                 gelu: str) -> str:
    """The name of an encoder's inference GEMM choice (its decision's and cache entry's key)."""
    return (f"gemm encoder {str(dtype).replace('torch.', '')} width={width} heads={heads} mlp={mlp_dim} "
            f"tokens={tokens} images={images} gelu={gelu}")


def widest_row(config, dtype: torch.dtype) -> int:
    """Bytes per token of an encoder block's largest temporary (the MLP's hidden row or the qkv row): what
    sizes the inference chunks (:func:`~vitkit.models.layers.chunk_images`)."""
    return max(config.mlp_dim, 3 * config.width) * dtype.itemsize


def encoder_shape(config, dtype: torch.dtype) -> Tuple:
    """(width, heads, MLP size, tokens, images, gelu) of a model's encoder as :func:`encoder_gemm` times it."""
    tokens = config.num_patches + config.num_prefix_tokens
    images = chunk_images(TIMING_BATCH, tokens, widest_row(config, dtype))
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
    ratios = [a / o for a, o in zip(times["aten"], times["onednn"])]
    return {"aten_s": statistics.median(times["aten"]), "onednn_s": statistics.median(times["onednn"]),
            "ratio": statistics.median(ratios), "rounds": rounds, "depth": depth,
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
    key = (dtype, width, heads, mlp_dim, tokens, images, gelu, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        what = encoder_what(dtype, width, heads, mlp_dim, tokens, images, gelu)
        choice = backend.cached_choice(what, kernels.KERNELS)
        if choice is None:
            result = measure_blocks(dtype, width, heads, mlp_dim, tokens, images, gelu)
            choice = backend.remember(what, {**result, "min_gain": MIN_GAIN},
                                      "onednn" if result["ratio"] >= MIN_GAIN else "aten")
        _CHOICE[key] = choice
    return choice
