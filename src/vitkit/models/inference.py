"""Fast inference: a frozen, streamlined forward pass of a VisionTransformer.

``prepare_inference(model, dtype)`` returns a module that computes the same
logits as ``model.eval()(x)`` with less work per image:

- no autograd, no shape bookkeeping in the hot loop, the patch embedding as
  one GEMM (Eq. 1 is a linear map of flattened patches);
- the residual adds of Eq. 2-3 fused into the GEMMs: the output projection
  and the second MLP layer accumulate straight into the residual stream
  (``x.addmm_(h, W.T)``), GELU in place, so the large intermediate tensors are
  written once and never copied;
- large batches run in chunks of about ``chunk_tokens`` tokens per GEMM.
  Every image is independent, so this changes no number; it keeps the MLP
  hidden activations in the CPU cache between fc1, GELU and fc2 and caps
  peak memory at the weights, the input, the residual stream and one chunk;
- ``dtype="bf16"``: weights and the residual stream / LayerNorm outputs are
  stored in bf16. Where the hardware multiplies bf16 natively (CUDA sm80+,
  AVX-512-BF16 / AMX CPUs) the GEMMs run in bf16. On CPUs without it (AVX2)
  torch's bf16 GEMM is a slow generic loop, so each product widens its bf16
  operands exactly to fp32 and runs on the fp32 units (fp32 accumulation, as
  native bf16 kernels do); products inside a block stay in fp32 scratch;
- ``quantize="int8"`` (CPU): dynamic int8 quantisation of every encoder
  Linear (per-tensor weights, activations quantised per call; fbgemm/oneDNN
  kernels). It changes the numbers: measure its accuracy before use.

Anything the streamlined path does not cover runs the model's own forward.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .vit import VisionTransformer
from .precision import sdpa

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of fp32, bf16, fp16") from None


def native_low_precision_matmul(dtype: torch.dtype, device: Union[str, torch.device] = "cpu") -> bool:
    """Whether ``dtype`` GEMMs run on dedicated hardware on ``device`` (else vitkit widens them to fp32)."""
    if dtype == torch.float32:
        return True
    if torch.device(device).type == "cuda":
        return torch.cuda.is_available()
    try:
        if dtype == torch.bfloat16:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False


def _int8_linear(layer: nn.Linear) -> nn.Module:
    """A dynamic int8 copy of ``layer`` (weights quantised per tensor; activations at each call)."""
    with warnings.catch_warnings():  # torch.ao's eager quantisation is deprecated in favour of torchao
        warnings.simplefilter("ignore")
        from torch.ao.nn.quantized.dynamic import Linear as QLinear
        from torch.ao.quantization import default_dynamic_qconfig

        src = copy.deepcopy(layer).float()
        src.qconfig = default_dynamic_qconfig
        return QLinear.from_float(src)


class FastViT(nn.Module):
    """The streamlined inference forward of a :class:`VisionTransformer` (see the module docstring).

    Shares the model's parameters (no copy in fp32); ``self.model`` is the
    wrapped model, used for input checks, position embeddings and the parts
    the fast path does not cover (hybrid backbones, padded inputs).
    """

    def __init__(self, model: VisionTransformer, *, widen: bool = False, quantize: Optional[str] = None,
                 chunk_tokens: int = 2048):
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.model = model.eval().requires_grad_(False)
        self.widen = widen
        self.chunk_tokens = chunk_tokens
        self.quantize = quantize
        self.qlinears: Optional[nn.ModuleList] = None
        if quantize == "int8":
            if any(p.device.type != "cpu" for p in model.parameters()):
                raise ValueError("int8 dynamic quantisation runs on the CPU: move the model with .cpu() first")
            self.qlinears = nn.ModuleList(
                nn.ModuleList(_int8_linear(lin) for lin in (b.attn.qkv, b.attn.proj, b.mlp.fc1, b.mlp.fc2))
                for b in model.blocks)
        elif quantize is not None:
            raise ValueError(f"unknown quantize={quantize!r}: use None or 'int8'")

    @property
    def config(self):
        return self.model.config

    # --- pieces -----------------------------------------------------------------------
    def _act_dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def _embed(self, images: torch.Tensor):
        m, cfg = self.model, self.model.config
        m._check_input(images)
        images = images.to(self._act_dtype())
        ph, pw = cfg.patch_size
        b, c, h, w = images.shape
        plain = getattr(cfg, "backbone", None) is None and h % ph == 0 and w % pw == 0
        if not plain:
            return m.embed(images)
        gh, gw = h // ph, w // pw
        # Eq. 1: flatten each P x P x C patch (channel-major, as the conv kernel is laid out) and project.
        patches = images.reshape(b, c, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5).reshape(b * gh * gw, c * ph * pw)
        proj = m.patch_embed.proj
        wmat = proj.weight.reshape(proj.weight.shape[0], -1)
        if self.widen:
            tokens = torch.addmm(proj.bias.float(), patches.float(), wmat.float().t()).to(images.dtype)
        else:
            tokens = torch.addmm(proj.bias, patches, wmat.t())
        return m.add_prefix_tokens(tokens.view(b, gh * gw, -1)), (gh, gw)

    def _weights(self, i: int, blk) -> List[tuple]:
        """(weight, bias, int8 module) of qkv, proj, fc1, fc2 of block ``i``, widened to fp32 if needed.

        Widening happens once per block per forward pass, shared by all chunks."""
        lins = (blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2)
        if self.qlinears is not None:
            return [(None, None, q) for q in self.qlinears[i]]
        if self.widen:
            return [(lin.weight.float(), None if lin.bias is None else lin.bias.float(), None) for lin in lins]
        return [(lin.weight, lin.bias, None) for lin in lins]

    @staticmethod
    def _linear(x: torch.Tensor, w: tuple) -> torch.Tensor:
        weight, bias, q = w
        if q is not None:
            return q(x.float())
        x = x.to(weight.dtype)
        return torch.mm(x, weight.t()) if bias is None else torch.addmm(bias, x, weight.t())

    @staticmethod
    def _linear_into(out: torch.Tensor, x: torch.Tensor, w: tuple) -> None:
        """out += x W^T + b; accumulates inside the GEMM when ``out`` has the GEMM's dtype."""
        weight, bias, q = w
        if q is None and out.dtype == weight.dtype:
            if bias is not None:
                out.add_(bias)
            out.addmm_(x.to(weight.dtype), weight.t())
        else:
            out.add_(FastViT._linear(x, w))

    def _block(self, blk, ws: List[tuple], x: torch.Tensor, t: int, bias: Optional[torch.Tensor]) -> None:
        """One encoder block (Eq. 2-3) on rows of whole images, updating the residual stream ``x`` in place."""
        attn, mlp = blk.attn, blk.mlp
        d = x.shape[-1]
        y = F.layer_norm(x, (d,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps)
        qkv = self._linear(y, ws[0])
        del y
        n_img = x.shape[0] // t
        qh, kh, vh = qkv.view(n_img, t, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if bias is None else bias.to(qh.dtype)
        o = sdpa(qh, kh, vh, mask)
        del qkv, qh, kh, vh
        self._linear_into(x, o.transpose(1, 2).reshape(x.shape[0], d), ws[1])
        del o
        y = F.layer_norm(x, (d,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
        h = self._linear(y, ws[2])
        del y
        if isinstance(mlp.act, nn.GELU):
            torch.ops.aten.gelu_(h, approximate=mlp.act.approximate)
        else:
            h = mlp.act(h)
        self._linear_into(x, h, ws[3])

    # --- forward --------------------------------------------------------------------------
    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Final normed tokens [B, prefix + N, D], like ``model.forward_features``."""
        with torch.inference_mode():
            return self._features(images)

    def _features(self, images: torch.Tensor) -> torch.Tensor:
        m, cfg = self.model, self.model.config
        x, grid = self._embed(images)
        b, t, d = x.shape
        pe = m.position_embedding(grid)
        every = cfg.posemb_where != "input"
        if pe is not None:
            pe = pe.to(x.dtype)
            if not every:
                x = x + pe
        x = x.contiguous()
        biases = [rel(grid, cfg.posemb_resize) for rel in m.rel_pos] if m.rel_pos is not None else None
        per_chunk = max(1, self.chunk_tokens // t)
        rows = x.view(b * t, d)
        for i, blk in enumerate(m.blocks):
            if pe is not None and every:
                x.add_(pe[i if pe.shape[0] > 1 else 0])
            bias = None if biases is None else biases[i if len(biases) > 1 else 0]
            ws = self._weights(i, blk)
            for s in range(0, b, per_chunk):
                self._block(blk, ws, rows[s * t:min(b, s + per_chunk) * t], t, bias)
            del ws
        return F.layer_norm(x, (d,), m.norm.weight, m.norm.bias, m.norm.eps)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Logits [B, classes] (or pooled features when the model has no head)."""
        m = self.model
        with torch.inference_mode():
            tokens = self._features(images)
            wide = (lambda t: t.float()) if self.widen else (lambda t: t)
            apply = lambda lin, x: self._linear(  # noqa: E731
                x, (wide(lin.weight), None if lin.bias is None else wide(lin.bias), None))
            if m.head_dist is not None:  # DeiT: mean of the class head and the distillation head
                feats = (apply(m.head, tokens[:, 0]) + apply(m.head_dist, tokens[:, 1])) / 2
                return feats.to(self._act_dtype())
            feats = m.pool(tokens)
            for lin in (m.pre_logits.fc if isinstance(m.pre_logits, nn.Sequential) else None, m.head):
                if isinstance(lin, nn.Linear):
                    feats = apply(lin, feats)
                    if lin is not m.head:
                        feats = torch.tanh(feats)
            return feats.to(self._act_dtype())


def prepare_inference(model: VisionTransformer, dtype: Union[str, torch.dtype] = "fp32", *,
                      device: Union[None, str, torch.device] = None, compile: bool = False,
                      quantize: Optional[str] = None, chunk_tokens: int = 2048,
                      compile_mode: Optional[str] = None) -> nn.Module:
    """Make ``model`` ready for fast inference; returns a module mapping images to logits.

    ``dtype``: ``fp32`` or ``bf16`` (the model's weights are converted in
    place). ``device``: moves the model (default: where it is). On the CPU
    the result is a :class:`FastViT`; on CUDA it is the model itself (fused
    flash attention via SDPA). ``compile=True``: the model's own forward under
    ``torch.compile`` instead (inductor fuses the elementwise work itself;
    ``compile_mode``: e.g. ``"reduce-overhead"`` for CUDA graphs).
    ``quantize="int8"``: dynamic int8 Linear layers (CPU, fp32 activations).
    The input may be in any float dtype; it is cast to the model's.
    """
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"prepare_inference takes a vitkit VisionTransformer, got {type(model).__name__}")
    if model.config.attention != "global":
        raise ValueError(f"prepare_inference streamlines global attention; an attention={model.config.attention!r} "
                         f"model runs its own forward: model.eval()(x) under torch.inference_mode()")
    dt = resolve_dtype(dtype)
    model = model.eval().requires_grad_(False)
    if device is not None:
        model = model.to(device)
    dev = next(model.parameters()).device
    if quantize is not None:
        if dev.type != "cpu":
            raise ValueError("int8 dynamic quantisation runs on the CPU: pass device='cpu'")
        if dt != torch.float32:
            raise ValueError("int8 quantisation takes fp32 activations: use dtype='fp32' with quantize='int8'")
        if compile:
            raise ValueError("int8 quantisation runs in vitkit's eager inference engine: drop compile=True")
    model = model.to(dt)
    if compile:
        # Inductor fuses the elementwise work itself: compile the model's own graph, not the hand-fused one.
        return _Eval(model, torch.compile(model, mode=compile_mode))
    if dev.type == "cpu":
        return FastViT(model, widen=not native_low_precision_matmul(dt, dev), quantize=quantize,
                       chunk_tokens=chunk_tokens)
    return _Eval(model)


class _Eval(nn.Module):
    """The model itself (optionally compiled) under ``torch.inference_mode``, input cast to its dtype."""

    def __init__(self, model: VisionTransformer, compiled: Optional[Any] = None):
        super().__init__()
        self.model = model
        self._compiled = compiled

    @property
    def config(self):
        return self.model.config

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        fn = self._compiled if self._compiled is not None else self.model
        with torch.inference_mode():
            return fn(images.to(self.model.norm.weight.dtype))


def inference_summary(module: nn.Module) -> Dict[str, Any]:
    """What a prepared module does (for benchmark reports)."""
    if isinstance(module, FastViT):
        return {"engine": "FastViT", "compiled": False, "widen_to_fp32": module.widen,
                "quantize": module.quantize, "chunk_tokens": module.chunk_tokens,
                "dtype": str(module._act_dtype()).replace("torch.", "")}
    compiled = isinstance(module, _Eval) and module._compiled is not None
    return {"engine": "nn.Module", "compiled": compiled}


__all__: List[str] = ["FastViT", "inference_summary", "native_low_precision_matmul", "prepare_inference",
                      "resolve_dtype"]
