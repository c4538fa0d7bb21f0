"""Attention rollout (Abnar & Zuidema, 2020), as in the paper's Figures 6 and 14.

The attention of every layer, fused over heads, gets the residual
connection's identity added and its rows renormalised, (A + I) / 2 for
row-stochastic A; the layers are multiplied from the first to the last.
Row i of the product says how much each input token contributes to token
i's final state; the map of an image is the row of what the head reads:
the class token's row (``pool="token"``), the mean of the patch tokens'
rows (``pool="gap"``, with or without a class token), or the mean of the
class and distillation tokens' rows (DeiT's distilled models, whose logits
are the mean of the two heads).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attention: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """[B, heads, T, T] -> [B, T, T] by the mean, max or min over heads."""
    if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2]:
        raise InputError(f"attention maps must be [batch, heads, tokens, tokens], got {tuple(attention.shape)}")
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    if head_fusion == "min":
        return attention.amin(dim=1)
    raise ConfigError(f"unknown head fusion {head_fusion!r}: use one of {', '.join(HEAD_FUSIONS)}")


def attention_rollout(attentions: Sequence[torch.Tensor], head_fusion: str = "mean",
                      residual: bool = True) -> torch.Tensor:
    """Roll attention out through the layers: [B, T, T], row i = contributions of the inputs to token i.

    ``attentions``: one [B, heads, T, T] map per layer, first layer first.
    Every fused map gets the identity added (``residual``) and its rows
    renormalised to sum to 1 before the product.
    """
    if len(attentions) == 0:
        raise InputError("no attention maps given: run the model with return_attention=True")
    result = None
    for attn in attentions:
        a = fuse_heads(attn.detach().double(), head_fusion)
        if residual:
            a = a + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
        result = a if result is None else a @ result
    return result.float()


READOUTS = ("token", "gap", "distilled")


def readout_of(config) -> str:
    """What a model's head reads (a :class:`vitkit.ViTConfig`): ``token`` (the class token), ``gap`` (the
    mean of the patch tokens) or ``distilled`` (the mean of the class and distillation tokens)."""
    if config.distill_token and config.distill_head:
        return "distilled"
    return "token" if config.pool == "token" else "gap"


def rollout_to_grid(rollout: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 1,
                    readout: Optional[str] = None) -> torch.Tensor:
    """The read-out's contribution map over the patch grid: [B, rows, cols].

    ``readout`` (see :func:`readout_of`): ``token``, the row of token 0; ``gap``, the mean of the patch
    tokens' rows; ``distilled``, the mean of rows 0 and 1. Default: ``token`` with prefix tokens, else
    ``gap``.
    """
    gh, gw = int(grid[0]), int(grid[1])
    if rollout.shape[-1] != num_prefix_tokens + gh * gw:
        raise InputError(f"rollout over {rollout.shape[-1]} tokens does not match a {gh}x{gw} grid with "
                         f"{num_prefix_tokens} prefix token(s)")
    readout = readout or ("token" if num_prefix_tokens else "gap")
    if readout not in READOUTS:
        raise ConfigError(f"unknown read-out {readout!r}: use one of {', '.join(READOUTS)}")
    need = {"token": 1, "distilled": 2, "gap": 0}[readout]
    if num_prefix_tokens < need:
        raise InputError(f"read-out {readout!r} needs {need} prefix token(s), the rollout has {num_prefix_tokens}")
    cols = rollout[..., num_prefix_tokens:]
    if readout == "token":
        row = cols[:, 0]
    elif readout == "distilled":
        row = cols[:, :2].mean(dim=1)
    else:
        row = cols[:, num_prefix_tokens:].mean(dim=1)
    return row.reshape(-1, gh, gw)


@torch.no_grad()
def rollout_maps(model: torch.nn.Module, x: torch.Tensor, head_fusion: str = "mean",
                 upsample: bool = True) -> torch.Tensor:
    """Attention-rollout maps of a batch: [B, H, W] at the input size (``upsample``) or [B, rows, cols].

    Works at any resolution the model accepts (set ``dynamic_img_size`` or
    call ``model.set_img_size`` for other sizes) and any patch size. The maps
    are the raw contributions (not rescaled); with ``dynamic_img_pad`` the
    padded border is cropped away after upsampling.
    """
    model.eval()
    out = model.forward_intermediates(x, output_fmt="dict", return_attention=True)
    roll = attention_rollout(out["attention"], head_fusion)
    maps = rollout_to_grid(roll, out["grid"], model.config.num_prefix_tokens, readout_of(model.config))
    if not upsample:
        return maps
    (gh, gw), (ph, pw) = out["grid"], model.config.pixel_patch_size  # pixels per token (hybrids: x stride)
    up = F.interpolate(maps[:, None], size=(gh * ph, gw * pw), mode="bilinear", align_corners=False)[:, 0]
    return up[:, :x.shape[-2], :x.shape[-1]]


def normalize_maps(maps: torch.Tensor, eps: Optional[float] = 1e-12) -> torch.Tensor:
    """Rescale each map to [0, 1] by its own minimum and maximum (for display)."""
    flat = maps.flatten(1)
    lo, hi = flat.min(dim=1).values, flat.max(dim=1).values
    scale = (hi - lo).clamp_min(eps)
    return (maps - lo.view(-1, *[1] * (maps.ndim - 1))) / scale.view(-1, *[1] * (maps.ndim - 1))
