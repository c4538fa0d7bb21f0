"""Building blocks of the encoder: patch embedding (Eq. 1), MSA, MLP and the pre-norm block (Eq. 2-3)."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .precision import attention, conv2d, linear, widen_bf16


class PatchEmbed(nn.Module):
    """Eq. 1's linear projection E of flattened P x P patches, as a conv with kernel = stride = P.

    Returns the patch grid [B, D, rows, cols]; flattening it row-major gives
    the token sequence. ``pad=True`` pads right/bottom to a multiple of P.
    """

    def __init__(self, patch_size: Tuple[int, int], in_chans: int, width: int, pad: bool = False):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.pad = pad
        self.proj = nn.Conv2d(in_chans, width, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad:
            ph, pw = self.patch_size
            h, w = x.shape[-2:]
            x = F.pad(x, (0, (-w) % pw, 0, (-h) % ph))
        if self._as_gemm(x):
            return self._gemm(x)
        return conv2d(x, self.proj)

    # Training on a CPU, the same projection as one GEMM over the flattened patches is 1.1-4x faster than
    # oneDNN's convolution for short patch vectors (the weight-gradient kernel dominates), measured up to
    # 3 x 8 x 8 = 192 values; at 3 x 16 x 16 = 768 the two are within the noise (docs/performance.md).
    GEMM_MAX_PATCH_VALUES = 256

    def _as_gemm(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and torch.is_grad_enabled() and self.proj.weight.requires_grad
                and self.proj.weight[0].numel() <= self.GEMM_MAX_PATCH_VALUES and not widen_bf16(x))

    def _gemm(self, x: torch.Tensor) -> torch.Tensor:
        """The convolution as patches [B, rows, cols, C*ph*pw] @ W^T: identical sums, the grid returned as
        a [B, D, rows, cols] view whose token order (row-major) flattens without a copy."""
        b, c, h, w = x.shape
        ph, pw = self.patch_size
        rows, cols = h // ph, w // pw
        x = x[:, :, :rows * ph, :cols * pw]  # what a stride-P convolution without padding reads
        patches = x.reshape(b, c, rows, ph, cols, pw).permute(0, 2, 4, 1, 3, 5).reshape(b, rows, cols, -1)
        w_ = self.proj.weight.reshape(self.proj.out_channels, -1)
        return F.linear(patches, w_, self.proj.bias).permute(0, 3, 1, 2)


class Attention(nn.Module):
    """Multi-head self-attention with one fused q/k/v projection.

    ``need_weights=False`` uses ``F.scaled_dot_product_attention`` (fused
    kernel); ``need_weights=True`` computes softmax(QK^T/sqrt(d) + bias) V
    explicitly for this call and also returns the weights [B, heads, T, T].
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

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None,
                need_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        b, t, d = x.shape
        q, k, v = linear(x, self.qkv).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        weights = None
        if need_weights:
            logits = (q * self.scale) @ k.transpose(-2, -1)
            if bias is not None:
                logits = logits + bias
            weights = logits.softmax(dim=-1)
            out = F.dropout(weights, self.attn_drop, self.training) @ v
        else:
            out = attention(q, k, v, None if bias is None else bias.to(q.dtype),
                            self.attn_drop if self.training else 0.0)
        out = out.transpose(1, 2).reshape(b, t, d)
        return self.proj_drop(linear(out, self.proj)), weights


class Mlp(nn.Module):
    """The MLP of Eq. 3: Linear -> GELU -> Linear, dropout after each dense layer."""

    def __init__(self, width: int, hidden: int, gelu: str = "exact", drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        self.fc2 = nn.Linear(hidden, width)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(linear(self.drop(self.act(linear(x, self.fc1))), self.fc2))


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample, rescale the rest."""
    if rate == 0.0 or not training:
        return x
    keep = 1.0 - rate
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class Block(nn.Module):
    """Pre-norm encoder block: z' = z + MSA(LN(z)) (Eq. 2); z = z' + MLP(LN(z')) (Eq. 3)."""

    def __init__(self, width: int, num_heads: int, mlp_dim: int, *, qkv_bias: bool = True,
                 dropout: float = 0.0, attn_dropout: float = 0.0, drop_path: float = 0.0,
                 ln_eps: float = 1e-6, gelu: str = "exact"):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=ln_eps)
        self.attn = Attention(width, num_heads, qkv_bias, attn_dropout, dropout)
        self.norm2 = nn.LayerNorm(width, eps=ln_eps)
        self.mlp = Mlp(width, mlp_dim, gelu, dropout)
        self.drop_path = drop_path

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None,
                need_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        y, weights = self.attn(self.norm1(x), bias, need_weights)
        x = x + drop_path(y, self.drop_path, self.training)
        x = x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)
        return x, weights


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
            raise ValueError("an axial block attends within rows and columns: it has no [tokens, tokens] attention "
                             "map (attention distance and rollout need attention='global') and no relative bias")
        b, n, d = x.shape
        gh, gw = grid
        x = self.row(x.reshape(b * gh, gw, d))[0]  # each row a sequence of gw tokens
        x = x.reshape(b, gh, gw, d).transpose(1, 2).reshape(b * gw, gh, d)  # each column one of gh tokens
        x = self.col(x)[0]
        return x.reshape(b, gw, gh, d).transpose(1, 2).reshape(b, n, d), None

    def sublayers(self) -> Tuple[Block, Block]:
        return self.row, self.col
