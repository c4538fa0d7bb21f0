"""Plans that may time: :func:`plan` is :func:`kernel_plan.resolve` with the timings it lacks made now.

What is timed, each time on a model's own shape, by the one timing primitive (:func:`vitkit.timing.alternate`,
alternating rounds) and chosen by its one noise rule (:func:`vitkit.timing.decide`: a contender must beat the
baseline by :data:`vitkit.timing.MARGIN` in the median paired round):

- ``gemm``: encoder blocks in inference (evaluation mode, no autograd) on the chunk of images the model runs
  at a time, every product on ATen against every product on oneDNN (a product timed alone misjudges what
  each library does inside the model: own weights cold in the caches, GELU fused into the MLP's product);
- ``training``: a block's forward + backward with ``F.linear`` against each mix of libraries for a dense
  layer's three products (:data:`kernel_plan.MIXES`), bf16 under autocast as the trainer runs it;
- ``attention`` / ``attention training``: the fused kernel against the explicit path on q/k/v laid out as the
  model makes them (forward, + backward in training);
- ``int8``: a dynamic int8 Linear packed by each quantised engine, against torch's default engine.

Every timing is kept in the measurement table (the cache file): a later process reads the same choice and
computes the same numbers. One taken on a busy machine (:func:`vitkit.timing.quiet`) is marked so, and
``vitkit backend --measure`` times it again.
"""
from __future__ import annotations

import copy
import warnings
from typing import Optional, Sequence, Union

import torch
from torch import nn

from ..errors import ConfigError
from ..timing import MARGIN, ROUNDS, Timed, alternate, decide, quiet
from .kernel_plan import MIXES, Backend, KernelPlan, Measurements, bind, resolve
from .layers import Block
from .ops import int8_candidates, pack_int8, split_heads

DEPTH = 3  # inference: blocks per timed call, with distinct weights as in a model
TRAINING_DEPTH = 1


def plan(config, dtype: Union[None, torch.dtype, Sequence[torch.dtype]] = None, device="cpu",
         backend: Union[None, str, Backend] = None, measurements: Optional[Measurements] = None,
         quantized: bool = False, measure: bool = True, retime_noisy: bool = False) -> KernelPlan:
    """:func:`kernel_plan.resolve`, timing now (``measure``) every ``auto`` choice no measurement covers (and
    with ``retime_noisy`` every one timed on a busy machine)."""
    return resolve(config, dtype, device, backend, measurements, quantized, time_choice if measure else None,
                   retime_noisy)


def _entry(timed: Timed, base: str, names: dict) -> dict:
    winner = decide(timed, base)
    summary = ", ".join(f"{base}/{n} {timed.ratio(base, n):.2f}x" for n in timed if n != base)
    return {"choice": names.get(winner, winner), "summary": f"{summary} (needs >= {MARGIN}x)", "quiet": quiet(timed),
            "median_s": {n: timed[n].median for n in timed}, "cpu_wait": timed.cpu_wait}


def time_choice(kind: str, config, dtype: torch.dtype, tokens: int, images: int) -> dict:
    """Time the contenders of one choice (``gemm``, ``training``, ``attention``, ``attention training``,
    ``int8``) on ``config``'s shape; returns the table entry (``choice``, a ``summary``, medians)."""
    with torch.random.fork_rng(devices=[]):  # the timed modules' initialisation leaves the caller's RNG alone
        torch.manual_seed(0)
        if kind == "gemm":
            return _entry(_time_inference(config, dtype, tokens, images), "aten", {})
        if kind == "training":
            return _entry(_time_training(config, dtype, tokens, images), "aten", {})
        if kind.startswith("attention"):
            return _entry(_time_attention(config, dtype, tokens, images, kind.endswith("training")), "fused", {})
        if kind == "int8":
            default = torch.backends.quantized.engine
            return _entry(_time_int8(config), default, {})
    raise ConfigError(f"unknown kernel choice {kind!r}: one of gemm, training, attention, attention training, int8")


def _blocks(config, depth: int, train: bool):
    return [Block(config.width, config.num_heads, config.mlp_dim, gelu=config.gelu).train(train)
            for _ in range(depth)]


def _time_inference(config, dtype, tokens: int, images: int) -> Timed:
    blocks = _blocks(config, DEPTH, False)
    blocks = [b.to(dtype) for b in blocks]
    x = torch.randn(images, tokens, config.width).to(dtype)
    plans = {k: KernelPlan(gemm={str(dtype).replace("torch.", ""): k}) for k in ("aten", "onednn")}

    def run(p: KernelPlan) -> None:
        for b in blocks:
            bind(b, p)
        y = x
        for b in blocks:
            y = b(y)[0]

    with torch.inference_mode():
        return alternate({k: (lambda p=p: run(p)) for k, p in plans.items()}, repeats=ROUNDS)


def _time_training(config, dtype, tokens: int, images: int) -> Timed:
    blocks = _blocks(config, TRAINING_DEPTH, True)
    x, grad = torch.randn(images, tokens, config.width), torch.randn(images, tokens, config.width)
    params = [p for b in blocks for p in b.parameters()]
    name = str(dtype).replace("torch.", "")

    def run(mix: str) -> None:
        for b in blocks:
            bind(b, KernelPlan(training={name: mix}))
        y = x.detach().requires_grad_()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            for b in blocks:
                y = b(y)[0]
        y.float().backward(grad)
        for p in params:
            p.grad = None

    return alternate({m: (lambda m=m: run(m)) for m in ("aten",) + MIXES}, repeats=ROUNDS)


def _time_attention(config, dtype, tokens: int, images: int, grad: bool) -> Timed:
    from .ops import attention

    heads, dim = config.num_heads, config.width // config.num_heads
    images = min(images, 8)
    qkv = torch.randn(images * tokens, 3 * heads * dim).to(dtype).requires_grad_(grad)
    out_grad = torch.randn(images, heads, tokens, dim).to(dtype)

    def run(path: str) -> None:
        with torch.set_grad_enabled(grad):
            out = attention(*split_heads(qkv, images, tokens, heads, dim), path=path)
            if grad:
                out.backward(out_grad)

    with torch.inference_mode(not grad):
        return alternate({p: (lambda p=p: run(p)) for p in ("fused", "explicit")}, repeats=ROUNDS)


def _time_int8(config) -> Timed:
    from torch.ao.quantization import quantize_dynamic

    lin = nn.Linear(config.width, config.mlp_dim)
    x = torch.randn(2048, config.width)
    layers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for e in int8_candidates():
            layers[e] = pack_int8(lambda: quantize_dynamic(nn.Sequential(copy.deepcopy(lin)), {nn.Linear},
                                                           dtype=torch.qint8), e)
    with torch.inference_mode():
        return alternate({e: (lambda e=e: layers[e](x)) for e in layers}, repeats=ROUNDS)
