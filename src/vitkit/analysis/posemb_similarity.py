"""Position-embedding similarity (Figure 7 centre): the cosine similarity of every patch's
position embedding with every other, one small heat map per patch."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from ..errors import InputError
from .distance import patch_distances


def cosine_similarity_grid(table: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Cosine similarities of a patch table [rows*cols, D] (row-major): [rows, cols, rows, cols].

    ``sim[r, c]`` is the heat map of patch (r, c) against every patch.
    """
    gh, gw = int(grid[0]), int(grid[1])
    if table.ndim != 2 or table.shape[0] != gh * gw:
        raise InputError(f"expected a [{gh * gw}, width] table for a {gh}x{gw} grid, got {tuple(table.shape)}")
    t = table.detach().double()
    t = t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (t @ t.T).reshape(gh, gw, gh, gw).float()


@torch.no_grad()
def posemb_similarity(model: torch.nn.Module, grid: Optional[Sequence[int]] = None, table: int = 0) -> torch.Tensor:
    """Similarity maps [rows, cols, rows, cols] of the model's patch position embeddings.

    Uses ``model.position_embedding(grid)``, so learned 1D (``learn``),
    learned 2D (``learn2d``, row and column halves concatenated) and fixed
    ``sincos2d`` tables all work, at the trained grid or resized to ``grid``
    with the model's resize method. ``table`` picks the layer's table for
    ``posemb_where='every_layer'``. Class-token slots are left out.
    """
    cfg = model.config
    if cfg.posemb in ("none", "relative"):
        raise InputError(f"the model has posemb={cfg.posemb!r}: there is no additive position table to compare "
                         f"(relative position biases are per offset, not per patch)")
    grid = tuple(int(g) for g in grid) if grid is not None else cfg.grid_size
    pe = model.position_embedding(grid)
    if not 0 <= table < pe.shape[0]:
        raise InputError(f"table {table} does not exist: the model has {pe.shape[0]} position table(s)")
    return cosine_similarity_grid(pe[table, cfg.num_prefix_tokens:], grid)


def similarity_by_distance(sim: torch.Tensor) -> Dict[str, list]:
    """Mean similarity of all patch pairs at each Euclidean grid distance (rounded to the nearest
    integer): {"distance": [0, 1, ...], "similarity": [...], "pairs": [...]}."""
    gh, gw = sim.shape[0], sim.shape[1]
    dist = patch_distances((gh, gw), 1).round().long().reshape(-1)
    flat = sim.reshape(-1).double()
    out: Dict[str, list] = {"distance": [], "similarity": [], "pairs": []}
    for d in range(int(dist.max()) + 1):
        mask = dist == d
        if mask.any():
            out["distance"].append(d)
            out["similarity"].append(float(flat[mask].mean()))
            out["pairs"].append(int(mask.sum()))
    return out


def near_far_similarity(sim: torch.Tensor) -> Tuple[float, float]:
    """(mean similarity of the 4-neighbours, mean similarity of patches at least half the grid apart)."""
    gh, gw = sim.shape[0], sim.shape[1]
    dist = patch_distances((gh, gw), 1).reshape(-1)
    flat = sim.reshape(-1).double()
    near = flat[(dist > 0.5) & (dist < 1.5)]
    far = flat[dist >= max(gh, gw) / 2.0]
    if not len(near) or not len(far):
        raise InputError(f"a {gh}x{gw} grid is too small to compare near and far patches")
    return float(near.mean()), float(far.mean())
