"""The kernels the layers compute with, each taking its choice as an argument (the plan's: :mod:`kernel_plan`).

Nothing here decides or times anything: a layer reads its bound :class:`~vitkit.models.kernel_plan.KernelPlan`
and passes the choice in. What remains are the guards of what can run at all: oneDNN runs fp32, and bf16
where the CPU has native bf16 products; off the CPU every product is ATen's (the device's library); a graph
consumer (``torch.compile``, ``torch.export``, ONNX export, tracing, a dispatch mode such as the FLOP
counter) gets plain ATen products (:func:`graph_capture`), since oneDNN's linear primitive is not an op they
all know. Attention paths are plain ATen ops everywhere, so the plan's path holds under every consumer.

- GEMMs: ATen's ``addmm`` (MKL in fp32, oneDNN in bf16) or oneDNN's linear primitive
  (``torch.ops.mkldnn._linear_pointwise``, which can fuse the MLP's GELU); in training
  :class:`ChosenLinear` runs each of a dense layer's three products (y = x W^T + b, dx = g W, dW = g^T x)
  on its own library.
- bf16 on a CPU without bf16 products: the operands rounded to bf16 exactly as autocast does, widened
  (exactly) to fp32, multiplied with fp32 accumulation (what a bf16 kernel computes, up to summation order)
  and the result rounded to bf16 (:func:`widen_bf16`), at fp32 speed instead of torch's slow fallback.
- Attention: ``fused`` (``F.scaled_dot_product_attention``) or ``explicit`` (:func:`explicit_attention`,
  the weights materialised: the one definition rollout and attention maps use too).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError

BF16 = torch.bfloat16
KERNELS = ("aten", "onednn")
ATTENTION_PATHS = ("fused", "explicit")


def _probe_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_NATIVE_BF16 = _probe_native_bf16()  # a constant of the machine, so torch.compile traces the checks unbroken


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN's bf16 GEMM kernels run on this CPU (AVX-512-BF16 / AMX / AVX2-VNNI-2)."""
    return _NATIVE_BF16


def onednn_ok(dtype: torch.dtype) -> bool:
    """Whether oneDNN's linear primitive can run ``dtype`` products on this CPU."""
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    return dtype != BF16 or cpu_has_native_bf16()


def _exporting() -> bool:
    return hasattr(torch.compiler, "is_exporting") and torch.compiler.is_exporting()


def graph_capture() -> bool:
    """Whether a graph consumer is watching the calls: torch.compile / torch.export, ONNX export, TorchScript
    tracing, or a Python dispatch mode (FlopCounterMode, fake tensors)."""
    if torch.compiler.is_compiling() or _exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: PLC2701 - no public test
    except ImportError:  # pragma: no cover - every supported torch has it
        return False
    return _get_current_dispatch_mode() is not None


def _runs_onednn(kernel: str, x: torch.Tensor) -> bool:
    return kernel == "onednn" and x.device.type == "cpu" and onednn_ok(x.dtype) and not graph_capture()


def product_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a dense layer multiplies in: the autocast dtype inside an autocast region, else x's."""
    if x.is_floating_point() and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
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


# --- the products ------------------------------------------------------------------------------------
def _gemm(kernel: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    if kernel == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())


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


class ChosenLinear(torch.autograd.Function):
    """y = x W^T + b with each of the three products (forward, dx = g W, dW = g^T x) on the library named in
    ``mix``: ``F.linear``'s autograd formulas, so the same numbers up to summation order. x, W and b in one
    dtype (cast before, under autocast)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mix):
        rows = x.reshape(-1, x.shape[-1])
        y = _gemm(mix[0], rows, weight, bias)
        ctx.save_for_backward(rows, weight)
        ctx.mix, ctx.x_shape, ctx.has_bias = mix, x.shape, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _grad_input(ctx.mix[1], g, weight).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _grad_weight(ctx.mix[2], g, rows)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        return gx, gw, gb, None


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           mix: Optional[Tuple[str, str, str]] = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with autograd (the training path): widened to the fp32 units for bf16
    work on a CPU without bf16 products; with the products on ``mix`` (forward, grad_input, grad_weight; None:
    ``F.linear``) where they can run."""
    if widen_bf16(x):
        return _WidenedLinear.apply(x, weight, bias)
    if mix is not None and x.device.type == "cpu" and torch.is_grad_enabled() and not graph_capture():
        dtype = product_dtype(x)
        if onednn_ok(dtype):
            x, weight = x.to(dtype), weight.to(dtype)  # autocast's casts, recorded for the backward pass
            bias = None if bias is None else bias.to(dtype)
            with torch.autocast("cpu", enabled=False):
                return ChosenLinear.apply(x, weight, bias, mix)
    return F.linear(x, weight, bias)


def dense(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
          kernel: str = "aten") -> torch.Tensor:
    """x W^T + b on rows [M, K] without autograd (the inference path) on ``kernel`` where it can run."""
    if widen_bf16(x):  # bf16 operands on the fp32 units, fp32 accumulation, result rounded to bf16
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    if x.device.type != "cpu":
        return F.linear(x, weight, bias)
    return _gemm("onednn" if _runs_onednn(kernel, x) else "aten", x, weight, bias)


def dense_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], approximate: str,
               kernel: str = "aten") -> torch.Tensor:
    """GELU(x W^T + b) on rows [M, K] without autograd (the MLP's first layer): oneDNN fuses the GELU into
    the product; otherwise the product, then GELU in place."""
    if _runs_onednn(kernel, x) and not widen_bf16(x):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], approximate)
    return torch.ops.aten.gelu_(dense(x, weight, bias, "aten"), approximate=approximate)


# --- attention ---------------------------------------------------------------------------------------
def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       dropout_p: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d) + mask) V with the weights materialised: (output, weights [.., T, T]). For
    bf16/fp16 q/k/v the softmax accumulates in fp32 (ATen's softmax kernels do for these dtypes) and writes
    q's dtype: no fp32 copy of the [.., T, T] weights. The weights equal the fp32 softmax rounded to q's
    dtype but for rare ones a rounding step apart (a test bounds it)."""
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else logits + mask
    weights = logits.softmax(-1).to(q.dtype)  # a float mask promotes the logits; the weights stay in q's dtype
    return (F.dropout(weights, dropout_p) if dropout_p else weights) @ v, weights


def _run_path(path: str, q, k, v, mask, dropout_p):
    if path == "explicit":
        return explicit_attention(q, k, v, mask, dropout_p)[0]
    if path != "fused":
        raise ConfigError(f"attention path {path!r}: choose one of {', '.join(ATTENTION_PATHS)}")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
              dropout_p: float = 0.0, path: str = "fused") -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V on ``path`` (``fused`` off the CPU); bf16 on a CPU without bf16
    products runs the path on operands widened exactly to fp32 (softmax in fp32), rounded to bf16 after."""
    if q.device.type != "cpu":
        path = "fused"
    if widen_bf16(q):
        with torch.autocast("cpu", enabled=False):
            mask = None if attn_mask is None else attn_mask if attn_mask.dtype == torch.bool else attn_mask.float()
            return _run_path(path, _exact(q), _exact(k), _exact(v), mask, dropout_p).to(BF16)
    return _run_path(path, q, k, v, attn_mask, dropout_p)


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


# --- int8: the quantised engine that packs the weights ---------------------------------------------
INT8_ENGINES = ("x86", "fbgemm", "onednn")


def int8_candidates() -> list:
    """The quantised engines this torch build has, in :data:`INT8_ENGINES` order."""
    have = set(torch.backends.quantized.supported_engines)
    return [e for e in INT8_ENGINES if e in have]


def pack_int8(build, engine: str):
    """``build()`` (which quantises and packs) with ``engine`` as the quantised engine; the global setting is
    restored afterwards (the packed weights keep their engine's kernels whatever the setting is later)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        return build()
    finally:
        torch.backends.quantized.engine = before
