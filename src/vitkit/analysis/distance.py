"""Mean attention distance (Figure 7 right, Figure 11): how far each head looks, in pixels.

For a query patch i, the distance is sum_j a_ij * |c_i - c_j|, the
attention-weighted mean of the pixel distances between patch centres over
the key patches j (class-token keys dropped and the weights renormalised
over the patches); it is averaged over the query patches and the images.
Small values are local heads (like early CNN layers), large ones global.
"""
from __future__ import annotations

from typing import Iterable, Sequence, Union

import torch
from tqdm.auto import tqdm

from ..errors import InputError


def patch_distances(grid: Sequence[int], patch_size: Union[int, Sequence[int]]) -> torch.Tensor:
    """Euclidean pixel distances between the centres of all patches of a grid: [N, N] (row-major)."""
    gh, gw = int(grid[0]), int(grid[1])
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else (int(patch_size[0]), int(patch_size[1]))
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64) * ph, torch.arange(gw, dtype=torch.float64) * pw,
                            indexing="ij")
    centres = torch.stack([ys.reshape(-1), xs.reshape(-1)], dim=1)
    return torch.cdist(centres, centres)


def attention_distance(attention: torch.Tensor, grid: Sequence[int], patch_size: Union[int, Sequence[int]],
                       num_prefix_tokens: int = 1) -> torch.Tensor:
    """Mean attention distance per head of one layer's maps [B, heads, T, T], averaged over the batch: [heads]."""
    if attention.ndim != 4:
        raise InputError(f"attention maps must be [batch, heads, tokens, tokens], got {tuple(attention.shape)}")
    n = int(grid[0]) * int(grid[1])
    if attention.shape[-1] != num_prefix_tokens + n or attention.shape[-2] != attention.shape[-1]:
        raise InputError(f"attention over {attention.shape[-1]} tokens does not match a {grid[0]}x{grid[1]} grid "
                         f"with {num_prefix_tokens} prefix token(s)")
    a = attention[..., num_prefix_tokens:, num_prefix_tokens:].double()
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    dist = patch_distances(grid, patch_size).to(a.device)
    per_query = (a * dist).sum(dim=-1)  # [B, heads, N]
    return per_query.mean(dim=(0, 2)).float()


@torch.no_grad()
def mean_attention_distance(model: torch.nn.Module, batches: Iterable[torch.Tensor],
                            progress: bool = False) -> torch.Tensor:
    """Mean attention distance of every layer and head over all images: [layers, heads], in input pixels.

    ``batches``: model inputs [B, C, H, W] (a tensor is one batch).
    """
    if isinstance(batches, torch.Tensor):
        batches = [batches]
    model.eval()
    total, count = None, 0
    for x in tqdm(batches, desc="attention distance", disable=not progress, leave=False):
        out = model.forward_intermediates(x, output_fmt="dict", return_attention=True)
        d = torch.stack([attention_distance(a, out["grid"], model.config.pixel_patch_size,  # hybrids: ResNet stride
                                            model.config.num_prefix_tokens)
                         for a in out["attention"]]).double() * x.shape[0]
        total = d if total is None else total + d
        count += x.shape[0]
    if not count:
        raise InputError("no images given")
    return (total / count).float()
