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

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import ChosenLinear, gemm, gemm_into, training_kernels

BF16 = torch.bfloat16


def _probe_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_NATIVE_BF16 = _probe_native_bf16()  # a constant, so torch.compile traces the checks below without a break


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN's bf16 GEMM kernels run on this CPU (AVX-512-BF16 / AMX / AVX2-VNNI-2)."""
    return _NATIVE_BF16


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4
        return device_type == "cpu" and torch.is_autocast_cpu_enabled()


def _product_dtype(x: torch.Tensor) -> torch.dtype:
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
    return (x.dtype == BF16 or _product_dtype(x) == BF16) and not cpu_has_native_bf16()


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
        dtype = _product_dtype(x)
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


def dense_add_(out: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor] = None, module: Optional[nn.Module] = None) -> torch.Tensor:
    """out += x W^T + b in place; the add happens inside the GEMM (``addmm_``, beta = 1) when the product
    runs in ``out``'s dtype, so the product is never written to a temporary."""
    if module is not None or widen_bf16(x) or out.dtype != weight.dtype:
        return out.add_(dense(x, weight, bias, module))
    if bias is not None:
        out.add_(bias)
    return gemm_into(out, x, weight)


# On a CPU, torch's fused attention kernel (flash attention for CPU) takes q/k/v as the strided views of the
# qkv projection that the model makes; the explicit steps QK^T -> softmax -> AV first copy them into
# batched-matrix layout. Timed in that layout on a 2-core AMX Xeon (benchmarks/cpu_kernels.py, attention rows
# in benchmarks/results/intel-amx/cpu_kernels_attention.json: 16-577 tokens), the fused kernel was 1.18-1.77x
# faster than the explicit steps in fp32 training, 1.48-2.36x in fp32 inference and 1.2-8.9x in bf16 inference;
# only its bf16 backward is slow: the explicit path was 5.2-15.1x faster in bf16 training at 16-65 tokens and
# 1.5-1.8x at 197, the fused kernel 1.69x faster at 577. So the explicit path serves bf16/fp16 attention that
# needs gradients up to this many tokens (197 measured, 577 not); everything else takes the fused kernel. (An
# earlier rule, explicit for every sequence up to 128 tokens, came from timing contiguous q/k/v, which the
# model never has.)
CPU_EXPLICIT_ATTENTION_MAX_TOKENS = 256


def _explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                        dropout_p: float) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V with the weights materialised; what the fused kernel computes."""
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    if q.dtype in (torch.float16, BF16):  # softmax in fp32, as the fused kernels do
        weights = logits.softmax(-1, dtype=torch.float32).to(q.dtype)
    else:
        weights = logits.softmax(-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    return weights @ v


def explicit_on_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`attention` takes the explicit path: bf16/fp16 q/k/v on a CPU that need gradients, in
    sequences of at most :data:`CPU_EXPLICIT_ATTENTION_MAX_TOKENS` tokens."""
    return (q.device.type == "cpu" and q.dtype in (BF16, torch.float16)
            and max(q.shape[-2], k.shape[-2]) <= CPU_EXPLICIT_ATTENTION_MAX_TOKENS
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


ATTENTION_PATHS = ("fused", "explicit", "widened")


def attention_path(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The path :func:`attention` takes for these q/k/v: ``"widened"`` for bf16 on a CPU without bf16 GEMMs
    (the fused kernel on operands widened exactly to fp32, as :func:`linear` does), ``"explicit"`` where
    :func:`explicit_on_cpu` says so, else ``"fused"`` (``F.scaled_dot_product_attention``)."""
    if widen_bf16(q):
        return "widened"
    return "explicit" if explicit_on_cpu(q, k, v) else "fused"


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, path: Optional[str] = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V by the path :func:`attention_path` chooses; ``path`` forces one of
    :data:`ATTENTION_PATHS` (benchmarks compare them on the same operands)."""
    path = path or attention_path(q, k, v)
    if path == "explicit":
        return _explicit_attention(q, k, v, attn_mask, dropout_p)
    if path == "widened":  # softmax in fp32, as bf16 kernels do; the result rounded to bf16
        with torch.autocast("cpu", enabled=False):
            mask = None if attn_mask is None else attn_mask if attn_mask.dtype == torch.bool else attn_mask.float()
            return F.scaled_dot_product_attention(_exact(q), _exact(k), _exact(v), attn_mask=mask,
                                                  dropout_p=dropout_p).to(BF16)
    if path != "fused":
        raise ValueError(f"attention path {path!r}: choose one of {', '.join(ATTENTION_PATHS)}")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
