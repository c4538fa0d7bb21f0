"""Which GEMM kernel runs the inference products: chosen by a short measurement, cached per machine.

torch offers two CPU GEMM libraries for a dense layer: ATen's ``addmm`` (MKL in fp32, oneDNN in bf16) and
oneDNN's linear primitive (``torch.ops.mkldnn._linear_pointwise``). Which one is faster depends on the CPU,
the torch build and the operation: on a 2-core AMD EPYC with AVX-512 oneDNN ran the MLP's fp32 product at
~355 GFLOP/s against MKL's ~192 (issue 19), while on a quiet 2-core Intel Xeon with AMX MKL was level or
up to 6% faster in fp32; in bf16 on that Xeon oneDNN's linear with a bias was 1.03-1.16x ATen's ``addmm``
(which first copies the broadcast bias into the output), while for accumulating into the residual stream
(``addmm_``, beta = 1) ATen took 0.55x the time of oneDNN's linear followed by an add
(benchmarks/cpu_kernels.py, docs/performance.md). So vitkit measures instead of guessing, separately for
the two operations the model uses:

- ``linear``: y = x W^T + b (qkv, fc1, the patch embedding; in training every dense layer's forward);
- ``accumulate``: out += x W^T (the output projection and fc2, adding into the residual stream);

and for the two products of a training step's backward pass (:func:`vitkit.models.precision.linear`):

- ``grad_input``: dx = g W (the gradient flowing to the layer's input);
- ``grad_weight``: dW = g^T x (the weight's gradient, a reduction over all rows of the batch).

In training, a dense layer runs torch's own ``F.linear`` (and its autograd formula, all ATen) unless the
calibration found oneDNN clearly faster for one of ``linear``, ``grad_input`` or ``grad_weight`` in that
dtype *and* a dense layer's forward + backward with each product on its winner (:class:`ChosenLinear`)
then beats ``F.linear``'s by :data:`MIN_GAIN` at the same shape (operation ``training`` + the winners, e.g.
``training onednn/aten/aten``): a faster product alone does not make a faster layer (on the 2-core Xeon in
bf16, at ViT-S/16's shapes, oneDNN's forward product ran at 1.02-1.29x ATen's speed, the layer with it at
0.99-1.05x; benchmarks/cpu_kernels.py, training rows).

The first GEMM of an operation and dtype on a CPU times both kernels on a ViT-B/16 MLP-shaped
product ([2048 x 768] @ [768 x 3072]) in alternating rounds (about a second), and takes oneDNN only when
it is faster in the median of the paired per-round ratios by at least :data:`MIN_GAIN`; otherwise the
simpler ATen call. The verdict is cached in ``~/.cache/vitkit/gemm-kernels.json`` (``$XDG_CACHE_HOME``
respected) under a key naming the CPU model, its instruction-set flags, the torch version, the thread
count, the operation and the dtype, so a different machine, torch build or thread count measures again;
a measurement taken while other work loads the CPU (:func:`busy`) serves only the process that took it.
:func:`calibrate` reruns the measurement on demand.

Weights are used as they are stored (no pre-packed copies), so nothing needs invalidating when they
change: pre-packing (``torch.ops.mkldnn._reorder_linear_weight``, MKL's packed GEMM) measured within the
noise of plain weights here.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

KERNELS = ("aten", "onednn")
OPS = ("linear", "accumulate", "grad_input", "grad_weight")
TRAINING_OPS = ("linear", "grad_input", "grad_weight")  # forward, dx, dW of a dense layer in training
MIN_GAIN = 1.10  # oneDNN must be >= 10% faster in the median paired round to be chosen
SHAPE = (2048, 768, 3072)  # rows, in, out: the MLP of ViT-B/16, one inference chunk
_CHOICE: Dict[tuple, str] = {}


def _onednn_ok(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    if dtype == torch.bfloat16:
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return True


def _cpu_id() -> str:
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = value.strip()
                    break
    except OSError:
        pass
    return f"{model} [{hashlib.sha1(flags.encode()).hexdigest()[:10]}]"


def cache_key(dtype: torch.dtype, op: str = "linear") -> str:
    return (f"{_cpu_id()} | torch {torch.__version__} | threads {torch.get_num_threads()} | {op} "
            f"{str(dtype).replace('torch.', '')}")


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "vitkit" / "gemm-kernels.json"


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, entry: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache()
        data[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gemm-kernels-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only home: the choice still holds for this process
        pass


def measure(dtype: torch.dtype, op: str = "linear", rounds: int = 7, shape=SHAPE) -> dict:
    """Time both kernels for ``op`` on ``shape``, alternating the order each round; returns per-kernel
    median seconds and the median paired ratio aten / onednn (> 1: oneDNN faster)."""
    training = _training_products(op)
    if op not in OPS and training is None:
        raise ValueError(f"unknown GEMM operation {op!r}: use one of {', '.join(OPS)}")
    m, k, n = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).mul_(k ** -0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    out = torch.zeros(m, n, dtype=dtype)
    grad = torch.randn(m, n, generator=g).to(dtype)
    if op == "linear":
        fns = {kern: (lambda kern=kern: _gemm(kern, x, w, b)) for kern in KERNELS}
    elif op == "accumulate":
        fns = {kern: (lambda kern=kern: _gemm_into(kern, out, x, w)) for kern in KERNELS}
    elif op == "grad_input":
        fns = {kern: (lambda kern=kern: _grad_input(kern, grad, w)) for kern in KERNELS}
    elif op == "grad_weight":
        fns = {kern: (lambda kern=kern: _grad_weight(kern, grad, x)) for kern in KERNELS}
    else:  # a dense layer's forward + backward: F.linear's autograd ("aten") vs the chosen products ("onednn")
        fns = {kern: (lambda kern=kern: layer_step(None if kern == "aten" else training, x, w, b, grad))
               for kern in KERNELS}
    times = _paired_rounds(fns, rounds, autograd=training is not None)
    ratios = [a / o for a, o in zip(times["aten"], times["onednn"])]
    return {"aten_s": statistics.median(times["aten"]), "onednn_s": statistics.median(times["onednn"]),
            "ratio": statistics.median(ratios), "rounds": rounds, "shape": list(shape)}


def _paired_rounds(fns: dict, rounds: int, autograd: bool = False) -> Dict[str, list]:
    """Seconds per call of each function, one call each per round, the order reversed every other round
    (after one untimed call each), under ``inference_mode`` (with autograd on where ``autograd``)."""
    names = list(fns)
    times: Dict[str, list] = {n: [] for n in names}
    with torch.enable_grad() if autograd else torch.inference_mode():
        for n in names:
            fns[n]()
        for r in range(rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                fns[n]()
                times[n].append(time.perf_counter() - t0)
    return times


def _remember(key: str, process_key: tuple, result: dict, choice: str) -> str:
    """Keep a calibration's choice for this process, and in the cache file unless the machine was
    :func:`busy` around the measurement."""
    if not busy():
        _write_cache(key, {**result, "kernel": choice, "min_gain": MIN_GAIN,
                           "load": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    _CHOICE[process_key] = choice
    for key in [k for k in _CHOICE if k[0] == "training"]:  # decided on the products' former choices
        del _CHOICE[key]
    return choice


def busy() -> bool:
    """Whether other work shares the CPU: a 1-minute load average above the core count (+0.5). Timings
    taken then mislead (on the 2-core Xeon a calibration under load 3-10 found oneDNN's fp32 linear 1.12x
    faster, one on the quiet machine 0.87-1.01x), so they are used by this process but not cached."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return False
    return load > (os.cpu_count() or 1) + 0.5


def calibrate(dtype: torch.dtype, op: str = "linear", rounds: int = 7) -> str:
    """Measure now and return the kernel for ``op`` in ``dtype`` on this CPU; cached for later processes
    unless the machine was :func:`busy` around the measurement."""
    result = measure(dtype, op, rounds)
    choice = "onednn" if result["ratio"] >= MIN_GAIN else "aten"
    return _remember(cache_key(dtype, op), (dtype, op, torch.get_num_threads()), result, choice)


def gemm_kernel(dtype: torch.dtype, device: torch.device, op: str = "linear") -> str:
    """The kernel for the GEMM ``op`` in ``dtype`` on ``device``: ``aten`` everywhere except on a CPU where
    the cached (or, the first time, a fresh) measurement found oneDNN's linear clearly faster."""
    if device.type != "cpu" or not _onednn_ok(dtype) or torch.compiler.is_compiling():
        return "aten"  # CUDA: cuBLAS via aten; compiled: inductor picks its own kernels
    key = (dtype, op, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        entry = _read_cache().get(cache_key(dtype, op))
        choice = entry["kernel"] if entry and entry.get("kernel") in KERNELS else calibrate(dtype, op)
        _CHOICE[key] = choice
    return choice


def training_kernels(dtype: torch.dtype, device: torch.device) -> Optional[Tuple[str, str, str]]:
    """The kernels of a training step's dense-layer products (forward, grad_input, grad_weight) in ``dtype``
    on ``device``, or None where all three are ATen (the layer then runs ``F.linear``)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16) or torch.compiler.is_compiling():
        return None
    key = ("training", dtype, torch.get_num_threads())  # called for every dense layer: decided once
    if key not in _CHOICE:
        chosen = tuple(gemm_kernel(dtype, device, op) for op in TRAINING_OPS) if _onednn_ok(dtype) else ()
        faster = "onednn" in chosen and gemm_kernel(dtype, device, _training_op(chosen)) == "onednn"
        _CHOICE[key] = chosen if faster else None
    return _CHOICE[key]


def _training_op(chosen) -> str:
    return "training " + "/".join(chosen)


def _training_products(op: str) -> Optional[Tuple[str, ...]]:
    """The winners named by a ``training a/b/c`` operation, or None for any other name."""
    name, _, products = op.partition(" ")
    chosen = tuple(products.split("/"))
    return chosen if name == "training" and len(chosen) == 3 and set(chosen) <= set(KERNELS) else None


def summary(dtype: torch.dtype, device: str = "cpu") -> dict:
    """The kernel in use for each operation in ``dtype`` and the measurement behind it (for reports)."""
    dev = torch.device(device)
    out = {}
    for op in OPS:
        kern = gemm_kernel(dtype, dev, op)
        entry = _read_cache().get(cache_key(dtype, op)) if dev.type == "cpu" else None
        out[op] = {"kernel": kern, "aten_over_onednn": None if not entry else round(entry["ratio"], 3)}
    chosen = training_kernels(dtype, dev)
    out["training"] = {"kernel": "aten" if chosen is None else "/".join(chosen), "aten_over_onednn": None}
    return out


# --- int8: which quantised engine packs the weights ---------------------------------------------------
# torch packs a dynamic int8 Linear's weights for the quantised engine active at packing time, and the packed
# weights keep that engine's kernels whatever the global setting is later. The default engine on x86 ("x86",
# FBGEMM) is not always the fastest: on a 2-core AMX Xeon oneDNN's int8 kernels ran ViT-B/16 1.8x faster,
# with the same predictions (benchmarks/int8.py). So vitkit times the engines once per machine, like the GEMMs.
INT8_ENGINES = ("x86", "fbgemm", "onednn")


def _int8_candidates() -> list:
    have = set(torch.backends.quantized.supported_engines)
    return [e for e in INT8_ENGINES if e in have]


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
    engines = _int8_candidates()
    default = torch.backends.quantized.engine
    layers = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        for e in engines:
            layers[e] = pack_int8(lambda: quantize_dynamic(nn.Sequential(copy.deepcopy(lin)), {nn.Linear},
                                                           dtype=torch.qint8), e)
    times = _paired_rounds({e: (lambda e=e: layers[e](x)) for e in engines}, rounds)
    med = {e: statistics.median(v) for e, v in times.items()}
    return {"seconds": med, "default": default, "rounds": rounds, "shape": list(shape),
            "ratio": {e: statistics.median([a / b for a, b in zip(times[default], times[e])])
                      for e in engines if default in times}}


def pack_int8(build, engine: str):
    """``build()`` (which quantises and packs) with ``engine`` as the quantised engine; the global setting is
    restored afterwards."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        return build()
    finally:
        torch.backends.quantized.engine = before


def int8_engine() -> str:
    """The engine to pack dynamic int8 Linear weights with on this CPU: torch's default, unless the cached
    (or, the first time, a fresh) measurement found another one at least :data:`MIN_GAIN` faster."""
    default = torch.backends.quantized.engine
    key = ("int8", default, torch.get_num_threads())
    choice = _CHOICE.get(key)
    if choice is None:
        entry = _read_cache().get(cache_key(torch.qint8, "int8"))
        if entry and entry.get("kernel") in _int8_candidates() and entry.get("default") == default:
            choice = entry["kernel"]
        else:
            choice = calibrate_int8()
        _CHOICE[key] = choice
    return choice


def calibrate_int8(rounds: int = 7) -> str:
    """Measure the int8 engines now and return (and, on a quiet machine, cache) the choice."""
    result = measure_int8(rounds)
    default = result["default"]
    best = max(result["ratio"], key=result["ratio"].get) if result["ratio"] else default
    choice = best if result["ratio"].get(best, 0.0) >= MIN_GAIN else default
    return _remember(cache_key(torch.qint8, "int8"), ("int8", default, torch.get_num_threads()), result, choice)


# --- the two kernels ------------------------------------------------------------------------------
def _gemm(kernel: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


def _gemm_into(kernel: str, out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if kernel == "onednn":
        return out.add_(torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
    return out.addmm_(x, w.t())


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
    with the products on ``chosen`` (what the ``training`` calibration and benchmarks/cpu_kernels.py time)."""
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


def gemm_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """out += x W^T in place with the kernel chosen for ``accumulate``."""
    return _gemm_into(gemm_kernel(x.dtype, x.device, "accumulate"), out, x, w)
