"""bf16 autocast on CPUs that cannot multiply bf16: the same numbers, at fp32 speed.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` torch runs linear
layers, convolutions and attention with bf16 kernels. CPUs without
AVX-512-BF16, AMX or AVX2-VNNI-2 have no bf16 dot-product instruction, and
torch's fallback kernels there are 5-20x slower than fp32 (measured on an AVX2
EPYC: see docs/performance.md). vitkit's layers call the functions below
instead of the modules. On such a CPU, inside a bf16 autocast region or on
bf16 tensors, they round the operands to bf16 exactly as autocast does,
widen them (exactly) to fp32, multiply on the fp32 units with fp32
accumulation - which is what a bf16 kernel computes, up to summation order -
and round the result to bf16. Everywhere else (fp32, CUDA, CPUs with native
bf16) they are the plain module calls, so fp32 numerics are untouched.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from . import backend
from .backend import cpu_has_native_bf16
from .kernels import ChosenLinear, gemm, gemm_gelu, training_kernels

BF16 = torch.bfloat16


def _autocast_on(device_type: str) -> bool:
    return torch.is_autocast_enabled(device_type)


def product_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a dense layer multiplies in: the CPU autocast dtype inside an autocast region, else x's."""
    if x.is_floating_point() and _autocast_on(x.device.type):
        return torch.get_autocast_dtype(x.device.type) if hasattr(torch, "get_autocast_dtype") \
            else torch.get_autocast_cpu_dtype()
    return x.dtype


def widen_bf16(x: torch.Tensor) -> bool:
    """True for bf16 work on a CPU without native bf16 GEMMs: inside a CPU bf16 autocast region, or on
    bf16 tensors (a model converted with ``.to(torch.bfloat16)``)."""
    if x.device.type != "cpu" or not x.is_floating_point():
        return False
    return (x.dtype == BF16 or product_dtype(x) == BF16) and not cpu_has_native_bf16()


def _exact(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Round to bf16 (as autocast's cast does), then widen back to fp32 without loss."""
    return None if t is None else t.to(BF16).float()


class _WidenedLinear(torch.autograd.Function):
    """y = bf16(x) bf16(W)^T + bf16(b) in fp32 arithmetic, returned in bf16; saves bf16 tensors for
    backward (the memory autocast would use) and computes the gradients in fp32."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        with torch.autocast("cpu", enabled=False):
            xb, wb = x.to(BF16), weight.to(BF16)
            y = F.linear(xb.float(), wb.float(), _exact(bias)).to(BF16)
        ctx.save_for_backward(xb, wb)
        ctx.x_dtype, ctx.w_dtype, ctx.has_bias = x.dtype, weight.dtype, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        xb, wb = ctx.saved_tensors
        g = grad.float()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = (g @ wb.float()).to(ctx.x_dtype)
        g2 = g.reshape(-1, g.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = (g2.t() @ xb.reshape(-1, xb.shape[-1]).float()).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0).to(ctx.w_dtype)
        return gx, gw, gb


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (the training path), widened to the fp32 units for bf16 work on a CPU
    without native bf16 GEMMs, and with its products on oneDNN where the calibration found that clearly
    faster on this CPU (:func:`kernels.training_kernels`; nowhere on the 2-core Xeon in fp32)."""
    if widen_bf16(x):
        return _WidenedLinear.apply(x, weight, bias)
    if x.device.type == "cpu" and torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        dtype = product_dtype(x)
        chosen = training_kernels(dtype, x.device)
        if chosen is not None:
            x, weight = x.to(dtype), weight.to(dtype)  # autocast's casts, recorded for the backward pass
            bias = None if bias is None else bias.to(dtype)
            with torch.autocast("cpu", enabled=False):
                return ChosenLinear.apply(x, weight, bias, chosen)
    return F.linear(x, weight, bias)


# --- inference GEMMs (no autograd) ------------------------------------------------------------------
def dense(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None,
          module: Optional[nn.Module] = None) -> torch.Tensor:
    """x W^T + b on rows [M, K] without autograd, by the GEMM kernel :func:`kernels.gemm_kernel` chose for
    this dtype and device; ``module`` (instead of weight/bias): a layer to call, e.g. int8 quantised."""
    if module is not None:
        return module(x)
    if widen_bf16(x):  # bf16 operands on the fp32 units, fp32 accumulation, result rounded to bf16
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    return gemm(x, weight, bias)


def dense_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], approximate: str) -> torch.Tensor:
    """GELU(x W^T + b) on rows [M, K] without autograd (the MLP's first layer): the product and the GELU on the
    kernel :func:`kernels.gemm_kernel` chose (oneDNN fuses the GELU into the product)."""
    if widen_bf16(x):
        return torch.ops.aten.gelu_(dense(x, weight, bias), approximate=approximate)
    return gemm_gelu(x, weight, bias, approximate)


# --- attention ---------------------------------------------------------------------------------------
ATTENTION_PATHS = ("fused", "explicit", "widened")
ATTENTION_ROUNDS = 5
_ATTENTION: Dict[str, str] = {}
# the same choices by shape alone, for a graph being captured (which cannot read the thread count unbroken)
_CAPTURE: Dict[tuple, str] = {}


def forget() -> None:
    """Drop this process's attention choices (:func:`vitkit.models.backend.forget` calls it)."""
    _ATTENTION.clear()
    _CAPTURE.clear()


backend.on_forget(forget)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       dropout_p: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d) + mask) V with the weights materialised: (output, weights [.., T, T]). The
    one explicit definition: the weights returned for rollout and the explicit kernel path are this. For
    bf16/fp16 q/k/v the softmax accumulates in fp32 (ATen's softmax kernels do for these dtypes, on the CPU
    and on CUDA) and writes q's dtype: no fp32 copy of the [.., T, T] weights, which made the explicit path
    several times slower on an AMD EPYC with torch 2.14 (``benchmarks/cpu_kernels.py``'s attention rows). The
    weights equal the fp32 softmax rounded to q's dtype but for rare ones a rounding step apart (a test
    bounds it)."""
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    weights = logits.softmax(-1).to(q.dtype)  # a float mask promotes the logits; the weights stay in q's dtype
    return (F.dropout(weights, dropout_p) if dropout_p else weights) @ v, weights


def attention_what(q: torch.Tensor, k: torch.Tensor, grad: bool) -> str:
    """The name of the attention choice for these q/k/v (the key of its decision and its cache entry)."""
    return (f"attention {str(q.dtype).replace('torch.', '')} {'training' if grad else 'inference'} "
            f"heads={q.shape[-3]} q={q.shape[-2]} k={k.shape[-2]} d={q.shape[-1]} threads={torch.get_num_threads()}")


def decided_attention(what: str) -> Optional[str]:
    """The path this process chose for the attention choice ``what`` under ``auto``, if it has chosen."""
    return _ATTENTION.get(what)


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The kernel :func:`attention` runs for these q/k/v: ``fused`` off the CPU; else the declared
    ``attention`` (both paths are plain ATen ops every graph consumer knows), or under ``auto`` the path
    measured faster on this machine for this dtype (under graph capture, which cannot time kernels, the choice
    this process made for the shape, e.g. by :func:`settle_attention`, else ``fused``),
    gradient mode, head count, token count and head size (:func:`measure_attention`; cached). On a CPU
    without bf16 GEMMs, bf16 runs the chosen path on operands widened exactly to fp32 (``widened`` reports
    that for the fused path). The explicit path rounds the weights to bf16 before AV, the fused kernel
    keeps them in fp32: the two differ by bf16 rounding (bounded in tests/test_backend.py)."""
    declared = backend.current().attention
    if q.device.type != "cpu":
        return "fused"
    if declared == "auto":
        grad = _needs_grad(q, k, v)
        shape = (q.dtype, grad, q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1])
        if backend.graph_capture():  # it cannot time kernels: the choice this process made (settle_attention)
            declared = _CAPTURE.get(shape, "fused")
        else:
            what = attention_what(q, k, grad)
            declared = _ATTENTION.get(what) or backend.cached_choice(what, ("fused", "explicit"))
            if declared is None:
                declared = backend.remember(what, *_decide_attention(q, k, grad))
            _ATTENTION[what] = _CAPTURE[shape] = declared
    return "widened" if declared == "fused" and widen_bf16(q) else declared


def settle_attention(config, dtype: torch.dtype, grad: bool, images: int = 8) -> str:
    """Decide now (measuring if nothing is known) the attention path of a model of ``config`` (its heads, width and
    token count) in ``dtype`` for inference or training (``grad``): a graph consumer such as ``torch.compile``
    cannot time kernels while it captures, so call this before compiling."""
    heads, dim = config.num_heads, config.width // config.num_heads
    tokens = config.num_patches + config.num_prefix_tokens
    rows = config.head_rows  # the last block's queries: the read-out rows only
    with torch.set_grad_enabled(grad):
        qkv = torch.zeros(images * tokens, 3 * heads * dim, dtype=dtype, requires_grad=grad)
        q, k, v = split_heads(qkv, images, tokens, heads, dim)
        if rows is not None and rows < tokens:
            attention_path(q[:, :, :rows], k, v)
        return attention_path(q, k, v)


def _decide_attention(q: torch.Tensor, k: torch.Tensor, grad: bool) -> Tuple[dict, str]:
    result = measure_attention(q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, grad,
                               images=max(1, min(q.shape[0], 8)))
    return result, ("explicit" if result["ratio"] >= 1.0 else "fused")


def measure_attention(heads: int, q_tokens: int, k_tokens: int, head_dim: int, dtype: torch.dtype,
                      grad: bool, images: int = 8, rounds: int = ATTENTION_ROUNDS) -> dict:
    """Time the fused and explicit paths on q/k/v laid out as the model makes them (strided views of one
    projection), forward (+ backward where ``grad``), alternating rounds; ``ratio`` = fused / explicit
    median paired time (> 1: the explicit path is faster)."""
    g = torch.Generator().manual_seed(0)
    t = max(q_tokens, k_tokens)
    qkv = torch.randn(images * t, 3 * heads * head_dim, generator=g).to(dtype).requires_grad_(grad)
    out_grad = torch.randn(images, heads, q_tokens, head_dim, generator=g).to(dtype)

    def run(path: str):
        q, k, v = split_heads(qkv, images, t, heads, head_dim)
        out = _run_path(path, q[:, :, :q_tokens], k[:, :, :k_tokens], v[:, :, :k_tokens], None, 0.0)
        if grad:
            out.backward(out_grad)

    with backend.use_backend(attention="fused"):  # no nested decision while timing
        times = backend.paired_rounds({p: (lambda p=p: run(p)) for p in ("fused", "explicit")}, rounds, autograd=grad)
    return {"fused_s": times.median("fused"), "explicit_s": times.median("explicit"),
            "ratio": times.ratio("fused", "explicit"), "rounds": rounds, "images": images, "cpu_wait": times.cpu_wait}


def split_heads(qkv: torch.Tensor, n: int, t: int, heads: int, head_dim: int, parts: int = 3
                ) -> Tuple[torch.Tensor, ...]:
    """q, k, v [n, heads, t, head_dim] as views of the qkv projection's rows [n * t, 3 * heads * head_dim]
    (``parts=2``: k, v of a [n * t, 2 * heads * head_dim] projection)."""
    # split along the q/k/v axis, then heads before tokens: the same views as permute(2, 0, 3, 1, 4).unbind(0),
    # but autograd's stack then writes qkv's gradient in qkv's own layout, without a second strided copy
    return tuple(a.transpose(1, 2) for a in qkv.view(n, t, parts, heads, head_dim).unbind(2))


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """Attention output [n, heads, t, head_dim] -> token rows [n * t, heads * head_dim], heads concatenated."""
    n, h, t, dh = out.shape
    return out.transpose(1, 2).reshape(n * t, h * dh)


def _run_path(path: str, q, k, v, mask, dropout_p):
    if path == "explicit":
        return explicit_attention(q, k, v, mask, dropout_p)[0]
    if path != "fused":
        raise ConfigError(f"attention path {path!r}: choose one of {', '.join(ATTENTION_PATHS)}")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, path: Optional[str] = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V by the path :func:`attention_path` chooses; ``path`` forces one of
    :data:`ATTENTION_PATHS` (benchmarks compare them on the same operands)."""
    path = path or attention_path(q, k, v)
    if path == "widened" or widen_bf16(q):  # bf16 operands on the fp32 units; softmax in fp32; rounded to bf16
        inner = "fused" if path == "widened" else path
        with torch.autocast("cpu", enabled=False):
            mask = None if attn_mask is None else attn_mask if attn_mask.dtype == torch.bool else attn_mask.float()
            return _run_path(inner, _exact(q), _exact(k), _exact(v), mask, dropout_p).to(BF16)
    return _run_path(path, q, k, v, attn_mask, dropout_p)
