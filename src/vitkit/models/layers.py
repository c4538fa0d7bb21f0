"""Building blocks of the encoder: patch embedding (Eq. 1), MSA, MLP and the pre-norm block (Eq. 2-3).

Each module has one forward pass, used in training and in inference alike, so forward hooks, attention maps
and intermediates see the computation that produced the logits. Only the kernels differ, as the module's
bound plan (``self.plan``, a :class:`~vitkit.models.kernel_plan.KernelPlan`) says: in evaluation mode without
autograd (``model.eval()`` under ``torch.no_grad()`` / ``torch.inference_mode()``) the dense layers call
:func:`ops.dense` (no autograd bookkeeping) and the MLP's first layer and its GELU run as one call
(:func:`ops.dense_gelu`); in training :func:`ops.linear`.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .kernel_plan import STATIC
from .ops import (
    attention,
    dense,
    dense_gelu,
    explicit_attention,
    graph_capture,
    linear,
    merge_heads,
    product_dtype,
    split_heads,
)


def fast_inference(module: nn.Module) -> bool:
    """Whether ``module`` runs the inference kernels: evaluation mode, no autograd, no autocast (under
    autocast the training kernels run, so autocast's casting rules hold), not watched by a graph consumer."""
    return (not module.training and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
            and not (torch.cuda.is_available() and torch.is_autocast_enabled("cuda")) and not graph_capture())


class PatchEmbed(nn.Module):
    """Eq. 1's linear projection E of flattened P x P patches (weights stored as a conv, kernel = stride = P).

    Returns the patch grid [B, D, rows, cols]; flattening it row-major gives
    the token sequence. ``pad=True`` pads right/bottom to a multiple of P.
    The projection runs as one GEMM over the flattened patches, the same sums as the convolution, on every
    path (benchmarks/cpu_kernels.py times it against the convolution: the "patches" rows).
    """

    def __init__(self, patch_size: Tuple[int, int], in_chans: int, width: int, pad: bool = False, bias: bool = True):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.pad = pad
        self.proj = nn.Conv2d(in_chans, width, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.plan = STATIC

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images [B, C, H, W] -> the patch grid [B, D, rows, cols] (right / bottom padded first with ``pad``)."""
        if self.pad:
            ph, pw = self.patch_size
            h, w = x.shape[-2:]
            x = F.pad(x, (0, (-w) % pw, 0, (-h) % ph))
        return self.gemm(x)

    def gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution as patches [B, rows, cols, C*ph*pw] @ W^T: identical sums, the grid returned as
        a [B, D, rows, cols] view whose token order (row-major) flattens without a copy."""
        b, c, h, w = x.shape
        ph, pw = self.patch_size
        rows, cols = h // ph, w // pw
        x = x[:, :, :rows * ph, :cols * pw]  # what a stride-P convolution without padding reads
        patches = x.reshape(b, c, rows, ph, cols, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, rows, cols, -1)
        w_ = self.proj.weight.reshape(self.proj.out_channels, -1)
        if fast_inference(self):
            flat = dense(patches.reshape(b * rows * cols, -1), w_, self.proj.bias, self.plan.gemm_for(x.dtype))
            return flat.view(b, rows, cols, -1).permute(0, 3, 1, 2)
        return linear(patches, w_, self.proj.bias, self.plan.mix_for(product_dtype(x))).permute(0, 3, 1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection.

    ``need_weights=False`` uses :func:`ops.attention` on the plan's path (the fused kernel
    ``F.scaled_dot_product_attention`` or the explicit path); ``need_weights=True`` computes
    :func:`ops.explicit_attention` for this call and also returns the weights [B, heads, T, T].
    """

    def __init__(self, width: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = width // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(width, 3 * width, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(width, width)
        self.proj_drop = nn.Dropout(proj_drop)
        self.plan = STATIC

    def mix(self, qkv: torch.Tensor, n: int, t: int, bias: Optional[torch.Tensor] = None,
            need_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The attention of Eq. 2 on projected q/k/v rows [n * t, 3D] (or [n, t, 3D]) -> [n * t, D] heads
        concatenated, before the output projection."""
        return self.attend(*split_heads(qkv, n, t, self.num_heads, self.head_dim), bias, need_weights)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor] = None,
               need_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Heads q [n, heads, tq, dh], k/v [n, heads, tk, dh] -> (rows [n * tq, D], weights or None)."""
        drop = self.attn_drop if self.training else 0.0
        weights = None
        if need_weights:
            out, weights = explicit_attention(q, k, v, bias, drop)
        else:
            path = self.plan.attention_for(q.dtype, torch.is_grad_enabled() and q.requires_grad)
            out = attention(q, k, v, None if bias is None else bias.to(q.dtype), drop, path)
        return merge_heads(out), weights

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None, need_weights: bool = False,
                head_tokens: Optional[int] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Tokens [B, T, D] -> (attended tokens [B, T, D], the attention weights [B, heads, T, T] when
        ``need_weights``, else None). ``head_tokens``: only the first ``head_tokens`` tokens attend (queries),
        over all T (keys and values): [B, head_tokens, D] out, the same as without it (:meth:`Block.forward`)."""
        b, t, d = x.shape
        if head_tokens is None:
            out, weights = self.mix(_apply(x, self.qkv, self), b, t, bias, need_weights)
        else:
            q = _apply(x[:, :head_tokens], self.qkv, self, 0, d).view(b, head_tokens, self.num_heads, self.head_dim)
            k, v = split_heads(_apply(x, self.qkv, self, d, 3 * d), b, t, self.num_heads, self.head_dim, 2)
            out, weights = self.attend(q.transpose(1, 2), k, v, None if bias is None else bias[..., :head_tokens, :],
                                       need_weights)
            t = head_tokens
        return self.proj_drop(_apply(out, self.proj, self)).view(b, t, d), weights


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's approximation of GELU (its checkpoints were trained with it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x * sigmoid(1.702 x), elementwise."""
        return x * torch.sigmoid(1.702 * x)


class Mlp(nn.Module):
    """The MLP of Eq. 3: Linear -> GELU -> Linear, dropout after each dense layer (GELU in place when no
    autograd needs its input). ``gelu``: exact (erf), tanh (its tanh approximation) or quick (QuickGELU)."""

    def __init__(self, width: int, hidden: int, gelu: str = "exact", drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = QuickGELU() if gelu == "quick" else nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        self.fc2 = nn.Linear(hidden, width)
        self.drop = nn.Dropout(drop)
        self.plan = STATIC

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens [..., D] -> [..., D] through the two dense layers."""
        fast_gelu = fast_inference(self) and type(self.act) is nn.GELU
        if fast_gelu and type(self.fc1) is nn.Linear:  # product and GELU in one call (fused where chosen)
            rows = dense_gelu(x.reshape(-1, x.shape[-1]), self.fc1.weight, self.fc1.bias, self.act.approximate,
                              self.plan.gemm_for(x.dtype))
            h = rows.view(*x.shape[:-1], rows.shape[-1])
        elif fast_gelu:  # e.g. an int8 quantised fc1
            h = torch.ops.aten.gelu_(_apply(x, self.fc1, self), approximate=self.act.approximate)
        else:
            h = self.drop(self.act(_apply(x, self.fc1, self)))
        return self.drop(_apply(h, self.fc2, self))


class LayerScale(nn.Module):
    """A learned per-channel scale of a residual branch (Touvron et al. 2021; DeiT III, DINOv2)."""

    def __init__(self, width: int, init: float):
        super().__init__()
        self.init = float(init)
        self.gamma = nn.Parameter(torch.full((width,), self.init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x times the learned per-channel scale."""
        return x * self.gamma


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample, rescale the rest."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class PatchDropout(nn.Module):
    """PatchDropout (Liu et al. 2022) on tokens [B, prefix + N, D]: in training keep a random ``1 - rate`` of each
    image's patch tokens (in grid order) and every prefix token; positions must already be added. The rate is
    the call's (a schedule passes it step by step); evaluation never drops."""

    def __init__(self, prefix: int):
        super().__init__()
        self.prefix = prefix

    def forward(self, x: torch.Tensor, rate: float) -> torch.Tensor:
        n = x.shape[1] - self.prefix
        keep = max(1, int(round(n * (1.0 - rate))))
        if not self.training or keep >= n:
            return x
        idx = torch.rand(x.shape[0], n, device=x.device).argsort(dim=1)[:, :keep].sort(dim=1).values
        patches = x[:, self.prefix:].gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        return torch.cat([x[:, :self.prefix], patches], dim=1) if self.prefix else patches


def _apply(x: torch.Tensor, lin: nn.Module, owner: nn.Module, start: int = 0, stop: Optional[int] = None
           ) -> torch.Tensor:
    """A dense layer (its outputs ``start:stop``) on the kernels of ``owner``'s plan: :func:`ops.dense` on the
    rows (inference kernels) when ``owner`` is in :func:`fast_inference`, else :func:`ops.linear` (training);
    a layer that is not a plain ``nn.Linear`` (e.g. int8 dynamic quantised) is called as a module."""
    if type(lin) is not nn.Linear:
        out = lin(x)
        return out if (start, stop) == (0, None) else out[..., start:stop]
    w, b = lin.weight, lin.bias
    if (start, stop) != (0, None):  # a block of the weight's rows: a contiguous view, no copy
        w, b = w[start:stop], None if b is None else b[start:stop]
    if fast_inference(owner):
        rows = dense(x.reshape(-1, x.shape[-1]), w, b, owner.plan.gemm_for(x.dtype))
        return rows.view(*x.shape[:-1], rows.shape[-1])
    return linear(x, w, b, owner.plan.mix_for(product_dtype(x)))


class Block(nn.Module):
    """Pre-norm encoder block: z' = z + MSA(LN(z)) (Eq. 2); z = z' + MLP(LN(z')) (Eq. 3)."""

    def __init__(self, width: int, num_heads: int, mlp_dim: int, *, qkv_bias: bool = True,
                 dropout: float = 0.0, attn_dropout: float = 0.0, drop_path: float = 0.0,
                 ln_eps: float = 1e-6, gelu: str = "exact", layer_scale: Optional[float] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=ln_eps)
        self.attn = Attention(width, num_heads, qkv_bias, attn_dropout, dropout)
        self.norm2 = nn.LayerNorm(width, eps=ln_eps)
        self.mlp = Mlp(width, mlp_dim, gelu, dropout)
        self.drop_path = drop_path
        # LayerScale on both residual branches (DeiT III, DINOv2); None: the paper's block
        self.ls1 = LayerScale(width, layer_scale) if layer_scale is not None else None
        self.ls2 = LayerScale(width, layer_scale) if layer_scale is not None else None

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None, need_weights: bool = False,
                head_tokens: Optional[int] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Eq. 2-3 on tokens [B, T, D] (each residual branch scaled by LayerScale where the block has it);
        returns (tokens, attention weights or None). ``head_tokens``: the block's output for the first
        ``head_tokens`` tokens only, [B, head_tokens, D] (every token is still a key and value): the last block when the
        prefix tokens are read out (the plan's ``head_tokens``), about 84% of a B/16 block's products
        skipped, every row that is computed the same sums."""
        y, weights = self.attn(self.norm1(x), bias, need_weights, head_tokens)
        if head_tokens is not None:
            x = x[:, :head_tokens]
        if self.ls1 is not None:
            y = self.ls1(y)
        x = x + drop_path(y, self.drop_path, self.training)
        y = self.mlp(self.norm2(x))
        if self.ls2 is not None:
            y = self.ls2(y)
        x = x + drop_path(y, self.drop_path, self.training)
        return x, weights


class AttentionPool(nn.Module):
    """Multihead attention pooling (MAP; SigLIP's head): one learned query attends over the tokens, then
    an LN + MLP residual: z = MHA(q, x, x) W_o; out = z + MLP(LN(z)). Tokens [B, N, D] -> [B, D]."""

    def __init__(self, width: int, num_heads: int, mlp_dim: int, *, ln_eps: float = 1e-6, gelu: str = "exact"):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = width // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, width))
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width, eps=ln_eps)
        self.mlp = Mlp(width, mlp_dim, gelu)
        self.plan = STATIC

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens [B, N, D] -> one pooled vector per image [B, D]."""
        b, n, d = x.shape
        h, dh = self.num_heads, self.head_dim
        q = _apply(self.latent.expand(b, -1, -1).to(x.dtype), self.q, self).view(b, 1, h, dh).transpose(1, 2)
        k, v = (t.transpose(1, 2) for t in _apply(x, self.kv, self).view(b, n, 2, h, dh).unbind(2))
        path = self.plan.attention_for(q.dtype, torch.is_grad_enabled() and q.requires_grad)
        z = _apply(attention(q, k, v, path=path).transpose(1, 2).reshape(b, 1, d), self.proj, self)
        z = z + self.mlp(self.norm(z))
        return z[:, 0]


def lecun_normal_(t: torch.Tensor) -> torch.Tensor:
    """Flax's default kernel init: truncated normal with variance 1/fan_in."""
    fan_in = t[0].numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # stddev correction of a [-2, 2] truncation
    return nn.init.trunc_normal_(t, std=std, a=-2 * std, b=2 * std)


class AxialBlock(nn.Module):
    """Axial-ViT's block (Appendix D.6): a pre-norm block (row attention + MLP) over every row of the patch
    grid, then one (column attention + MLP) over every column. Tokens [B, rows * cols, D] in row-major
    order, no prefix tokens."""

    def __init__(self, row: Block, col: Block):
        super().__init__()
        self.row, self.col = row, col

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None, need_weights: bool = False, *,
                grid: Tuple[int, int]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if need_weights or bias is not None:
            raise ConfigError("an axial block attends within rows and columns: it has no [tokens, tokens] attention "
                             "map (attention distance and rollout need attention='global') and no relative bias")
        b, n, d = x.shape
        gh, gw = grid
        x = self.row(x.reshape(b * gh, gw, d))[0]  # each row a sequence of gw tokens
        x = x.reshape(b, gh, gw, d).transpose(1, 2).reshape(b * gw, gh, d)  # each column one of gh tokens
        x = self.col(x)[0]
        return x.reshape(b, gw, gh, d).transpose(1, 2).reshape(b, n, d), None

    def sublayers(self) -> Tuple[Block, Block]:
        return self.row, self.col
