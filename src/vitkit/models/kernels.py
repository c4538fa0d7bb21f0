"""The dense layers' GEMM library and the int8 engine: declared, or chosen by a short measurement.

torch offers two CPU GEMM libraries for a dense layer: ATen's ``addmm`` (MKL in fp32, oneDNN in bf16) and
oneDNN's linear primitive (``torch.ops.mkldnn._linear_pointwise``). Which is faster depends on the CPU and the
torch build (the committed benchmarks under benchmarks/results/ hold the measurements per machine kind), so
the declared backend's ``gemm`` field (:mod:`vitkit.models.backend`) is ``aten``, ``onednn`` or ``auto``.

Under ``auto`` the choice is made where the products run, by timing what runs there:

- inside a model's encoder in inference, by timing encoder blocks of the model's shape
  (:func:`vitkit.models.tune.encoder_gemm`, set with :func:`inference_gemms`). There the MLP's first layer and
  its GELU are one call (:func:`gemm_gelu`): ATen's ``addmm`` then GELU in place, or oneDNN's linear with the
  GELU fused as a post-op;
- inside a model's encoder in training, by timing encoder blocks' forward + backward with each mix of
  libraries for a dense layer's three products (:func:`vitkit.models.tune.encoder_training_gemms`, set with
  :func:`training_gemms`): the forward product y = x W^T + b, the input gradient dx = g W and the weight
  gradient dW = g^T x, on :class:`ChosenLinear`; ``F.linear`` (all three on ATen) unless a mix is faster;
- elsewhere in inference (a head, the patch embedding, a module outside a ViT), by timing the product alone
  on a ViT-B/16 MLP-shaped product ([2048 x 768] @ [768 x 3072]) in alternating rounds (about a second): oneDNN
  only when it is faster in the median of the paired per-round ratios by at least :data:`MIN_GAIN`; elsewhere
  in training ``F.linear`` (these layers hold a few percent of a ViT's products).

A product timed alone can misjudge what each library does inside the model (there every layer has its own
weights, cold in the caches, and a product that wins alone can lose inside a layer's backward pass): on an AMD
EPYC with AVX512-BF16 the layer-level decision taken at the B/16 calibration shape kept ViT-S/16 training on
ATen while mixes with oneDNN were 1.04-1.42x faster at S/16's own shapes (``benchmarks/cpu_kernels.py``).
Measurements run the first time a model call needs them (or on demand: ``vitkit backend --measure``) and are
cached by :mod:`vitkit.models.backend`. Graph consumers (compile, export, tracing, the FLOP counter) always get
ATen.

Weights are used as they are stored (no pre-packed copies), so nothing needs invalidating when they change.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from . import backend

KERNELS = ("aten", "onednn")
OPS = ("linear",)  # the products chosen alone (outside an encoder, in inference)
TRAINING_OPS = ("linear", "grad_input", "grad_weight")  # forward, dx, dW of a dense layer in training
MIN_GAIN = 1.10  # oneDNN must be >= 10% faster in the median paired round to be chosen
SHAPE = (2048, 768, 3072)  # rows, in, out: the MLP of ViT-B/16, one inference chunk
_CHOICE: Dict[tuple, object] = {}
_ENCODER: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("vitkit_encoder_gemm", default=None)
_TRAINING: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("vitkit_training_gemms", default=None)


@contextlib.contextmanager
def inference_gemms(kernel: Optional[str]) -> Iterator[None]:
    """Within: the inference products (``linear``) run on ``kernel``, an encoder's choice
    (:func:`vitkit.models.tune.encoder_gemm`); None: each product's own choice."""
    if kernel is not None and kernel not in KERNELS:
        raise ConfigError(f"GEMM library {kernel!r}: choose one of {', '.join(KERNELS)}")
    token = _ENCODER.set(kernel)
    try:
        yield
    finally:
        _ENCODER.reset(token)


def forget() -> None:
    """Drop this process's GEMM and int8 choices (:func:`vitkit.models.backend.forget` calls it)."""
    _CHOICE.clear()


backend.on_forget(forget)


def onednn_ok(dtype: torch.dtype) -> bool:
    """Whether oneDNN's linear primitive can run ``dtype`` products on this CPU."""
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    return dtype != torch.bfloat16 or backend.cpu_has_native_bf16()


def gemm_what(dtype: torch.dtype, op: str) -> str:
    """The name of the GEMM choice for ``op`` in ``dtype`` (its decision's and cache entry's key)."""
    return f"gemm {op} {str(dtype).replace('torch.', '')}"


def measure(dtype: torch.dtype, op: str = "linear", rounds: int = 7, shape=SHAPE) -> dict:
    """Time both kernels for ``op`` on ``shape``, alternating the order each round; returns per-kernel
    median seconds and the median paired ratio aten / onednn (> 1: oneDNN faster)."""
    if op not in OPS:
        raise ConfigError(f"unknown GEMM operation {op!r}: use one of {', '.join(OPS)}")
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).mul_(k ** -0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    fns = {kern: (lambda kern=kern: _gemm(kern, x, w, b)) for kern in KERNELS}
    times = backend.paired_rounds(fns, rounds)
    return {"aten_s": times.median("aten"), "onednn_s": times.median("onednn"), "ratio": times.ratio("aten", "onednn"),
            "rounds": rounds, "shape": list(shape), "cpu_wait": times.cpu_wait}


def calibrate(dtype: torch.dtype, op: str = "linear", rounds: int = 7) -> str:
    """Measure now and return the kernel for ``op`` in ``dtype`` on this CPU (cached for later processes
    unless the machine was busy)."""
    result = measure(dtype, op, rounds)
    choice = "onednn" if result["ratio"] >= MIN_GAIN else "aten"
    _CHOICE[(dtype, op, torch.get_num_threads())] = choice
    return backend.remember(gemm_what(dtype, op), {**result, "min_gain": MIN_GAIN}, choice)


def gemm_kernel(dtype: torch.dtype, device: torch.device, op: str = "linear") -> str:
    """The kernel for the GEMM ``op`` in ``dtype`` on ``device``: ATen off the CPU, under graph capture and
    where oneDNN cannot run the dtype; else the declared one, or under ``auto`` the cached (or, the first
    time, a fresh) measurement."""
    if device.type != "cpu" or backend.graph_capture() or not onednn_ok(dtype):
        return "aten"  # CUDA: cuBLAS via ATen; graph consumers: the plain ops they know
    declared = backend.current().gemm
    if declared != "auto":
        return declared
    encoder = _ENCODER.get() if op == "linear" else None
    if encoder is not None:  # inside an encoder in inference: the library its blocks were timed fastest with
        return encoder
    key = (dtype, op, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        choice = backend.cached_choice(gemm_what(dtype, op), KERNELS) or calibrate(dtype, op)
        _CHOICE[key] = choice
    return choice


def training_kernels(dtype: torch.dtype, device: torch.device) -> Optional[Tuple[str, str, str]]:
    """The kernels of a training step's dense-layer products (forward, grad_input, grad_weight) in ``dtype``
    on ``device``, or None where all three are ATen (the layer then runs ``F.linear``): the declared library,
    or under ``auto`` the mix an encoder's training blocks were timed fastest with (:func:`training_gemms`,
    set by the model around its blocks); outside an encoder (patch embedding, head, other modules) F.linear."""
    if device.type != "cpu" or backend.graph_capture() or not onednn_ok(dtype):  # capture first: no probe traced
        return None
    declared = backend.current().gemm
    if declared != "auto":
        return None if declared == "aten" else ("onednn",) * 3
    inside = _TRAINING.get()
    return inside[1] if inside is not None and inside[0] == dtype else None


@contextlib.contextmanager
def training_gemms(dtype: torch.dtype, mix: Optional[Tuple[str, ...]]) -> Iterator[None]:
    """Within: the training products of ``dtype`` run on ``mix`` (forward, grad_input, grad_weight), an
    encoder's choice (:func:`vitkit.models.tune.encoder_training_gemms`); None: ``F.linear``."""
    if mix is not None and (len(mix) != len(TRAINING_OPS) or not set(mix) <= set(KERNELS)):
        raise ConfigError(f"training GEMM mix {mix!r}: three of {', '.join(KERNELS)}")
    token = _TRAINING.set((dtype, None if mix is None else tuple(mix)))
    try:
        yield
    finally:
        _TRAINING.reset(token)


def mix_name(mix: Optional[Tuple[str, ...]]) -> str:
    """``aten`` for F.linear (None), else the three products' libraries joined by ``/``."""
    return "aten" if mix is None else "/".join(mix)


def parse_mix(name: str) -> Optional[Tuple[str, ...]]:
    """The inverse of :func:`mix_name`."""
    return None if name == "aten" else tuple(name.split("/"))


def summary(dtype: torch.dtype, device: str = "cpu") -> dict:
    """The kernel each product chosen alone in ``dtype`` runs now, without measuring: ``fixed``, ``measured``
    (this process or the cache), or ``not measured yet`` (the first model call that needs it measures).
    Encoders' choices: :func:`vitkit.models.backend.decisions`."""
    dev = torch.device(device)
    declared = backend.current().gemm
    out = {}
    for op in OPS:
        if dev.type != "cpu":
            out[op] = {"kernel": "aten", "why": f"off the CPU ({dev.type}): the device's library through ATen"}
        elif not onednn_ok(dtype):
            out[op] = {"kernel": "aten", "why": "only ATen runs this dtype here"}
        elif declared != "auto":
            out[op] = {"kernel": declared, "why": "declared"}
        else:
            entry = backend.read_cache().get(backend.cache_key(gemm_what(dtype, op)))
            key = (dtype, op, torch.get_num_threads())
            if key in _CHOICE:
                out[op] = {"kernel": _CHOICE[key], "why": "measured"}
            elif entry:
                out[op] = {"kernel": entry["choice"], "why": "cached measurement",
                           "aten_over_onednn": round(entry["ratio"], 3)}
            else:
                out[op] = {"kernel": None, "why": "not measured yet"}
    return out


# --- int8: which quantised engine packs the weights ---------------------------------------------------
# torch packs a dynamic int8 Linear's weights for the quantised engine active at packing time, and the packed
# weights keep that engine's kernels whatever the global setting is later. The default engine on x86 ("x86",
# FBGEMM) is not always the fastest: on a 2-core AMX Xeon oneDNN's int8 kernels ran ViT-B/16 1.8x faster,
# with the same predictions (benchmarks/int8.py). So vitkit times the engines once per machine, like the GEMMs.
INT8_ENGINES = ("x86", "fbgemm", "onednn")


def measure_int8(rounds: int = 7, shape=SHAPE) -> dict:
    """Time a dynamic int8 Linear of ``shape`` packed by each available engine (alternating rounds);
    returns median seconds per engine and the default engine's time over each other engine's."""
    import copy
    import warnings

    from torch import nn
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(k, n)
    x = torch.randn(m, k, generator=g)
    engines = int8_candidates()
    default = torch.backends.quantized.engine
    layers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        for e in engines:
            layers[e] = pack_int8(lambda: quantize_dynamic(nn.Sequential(copy.deepcopy(lin)), {nn.Linear},
                                                           dtype=torch.qint8), e)
    times = backend.paired_rounds({e: (lambda e=e: layers[e](x)) for e in engines}, rounds)
    return {"seconds": {e: times.median(e) for e in times}, "default": default, "rounds": rounds,
            "shape": list(shape), "cpu_wait": times.cpu_wait,
            "ratio": {e: times.ratio(default, e) for e in engines if default in times}}


def pack_int8(build, engine: str):
    """``build()`` (which quantises and packs) with ``engine`` as the quantised engine; the global setting is
    restored afterwards."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        return build()
    finally:
        torch.backends.quantized.engine = before


def int8_candidates() -> list:
    have = set(torch.backends.quantized.supported_engines)
    return [e for e in INT8_ENGINES if e in have]


def int8_engine() -> str:
    """The engine to pack dynamic int8 Linear weights with on this CPU: the declared one, or under ``auto``
    torch's default unless the cached (or, the first time, a fresh) measurement found another one at least
    :data:`MIN_GAIN` faster."""
    declared = backend.current().int8
    if declared != "auto":
        if declared not in int8_candidates():
            raise ConfigError(f"backend int8={declared}: this torch build has the quantised engines "
                              f"{', '.join(int8_candidates())}")
        return declared
    default = torch.backends.quantized.engine
    key = ("int8", default, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        choice = backend.cached_choice(f"int8 engine (default {default})", int8_candidates()) or calibrate_int8()
        _CHOICE[key] = choice
    return choice


def calibrate_int8(rounds: int = 7) -> str:
    """Measure the int8 engines now and return (and, on a quiet machine, cache) the choice."""
    result = measure_int8(rounds)
    default = result["default"]
    best = max(result["ratio"], key=result["ratio"].get) if result["ratio"] else default
    choice = best if result["ratio"].get(best, 0.0) >= MIN_GAIN else default
    _CHOICE[("int8", default, torch.get_num_threads())] = choice
    return backend.remember(f"int8 engine (default {default})", {**result, "min_gain": MIN_GAIN}, choice)


# --- the two kernels ------------------------------------------------------------------------------
def _gemm(kernel: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


def _gemm_gelu(kernel: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
               approximate: str) -> torch.Tensor:
    """GELU(x W^T + b); ``approximate``: "none" (erf) or "tanh", as in ``F.gelu``."""
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], approximate)
    return torch.ops.aten.gelu_(_gemm("aten", x, w, b), approximate=approximate)


def _grad_input(kernel: str, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """dx = g W for g [M, N], W [N, K] (oneDNN's linear takes W^T as its weight, a view)."""
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(g, w.t(), None, "none", [], "")
    return torch.mm(g, w)


def _grad_weight(kernel: str, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dW = g^T x for g [M, N], x [M, K]: the reduction over the M rows."""
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(g.t(), x.t(), None, "none", [], "")
    return torch.mm(g.t(), x)


def layer_step(chosen: Optional[Tuple[str, ...]], x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
               grad: torch.Tensor) -> None:
    """One dense layer's forward + backward on fresh leaves: ``F.linear`` (chosen None) or :class:`ChosenLinear`
    with the products on ``chosen`` (what benchmarks/cpu_kernels.py times per layer)."""
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    br = None if b is None else b.detach().requires_grad_()
    y = F.linear(xr, wr, br) if chosen is None else ChosenLinear.apply(xr, wr, br, chosen)
    y.backward(grad)


class ChosenLinear(torch.autograd.Function):
    """y = x W^T + b with each of the three products (forward, dx = g W, dW = g^T x) on the kernel named in
    ``chosen`` (see :func:`training_kernels`): ``F.linear``'s autograd formulas, so the same numbers up to
    summation order. x, W and b in one dtype (cast before, under autocast)."""

    @staticmethod
    def forward(ctx, x, weight, bias, chosen):
        rows = x.reshape(-1, x.shape[-1])
        y = _gemm(chosen[0], rows, weight, bias)
        ctx.save_for_backward(rows, weight)
        ctx.chosen, ctx.x_shape, ctx.has_bias = chosen, x.shape, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _grad_input(ctx.chosen[1], g, weight).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _grad_weight(ctx.chosen[2], g, rows)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        return gx, gw, gb, None


def gemm(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x W^T + b on rows [M, K] (no autograd) with the kernel chosen for ``linear``."""
    return _gemm(gemm_kernel(x.dtype, x.device, "linear"), x, w, b)


def gemm_gelu(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None,
              approximate: str = "none") -> torch.Tensor:
    """GELU(x W^T + b) on rows [M, K] (no autograd) with the kernel chosen for ``linear`` (oneDNN fuses the GELU)."""
    return _gemm_gelu(gemm_kernel(x.dtype, x.device, "linear"), x, w, b, approximate)
