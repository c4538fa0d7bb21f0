"""Position embeddings (Appendix D.4) and their resizing to a new patch grid (Section 3.2)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError

Grid = Tuple[int, int]


def _check_grid(grid: Sequence[int], what: str) -> Grid:
    if len(grid) != 2 or any((not isinstance(n, int)) or isinstance(n, bool) or n <= 0 for n in grid):
        raise InputError(f"{what} must be two positive ints (rows, columns), got {tuple(grid)!r}")
    return int(grid[0]), int(grid[1])


def resize_grid(grid: torch.Tensor, new_grid: Sequence[int], method: str = "bilinear",
                antialias: bool = False) -> torch.Tensor:
    """Resize a [..., rows, cols, C] tensor on its two grid axes.

    ``bilinear`` is the authors' resize: linear interpolation with aligned
    corners, the same numbers as ``scipy.ndimage.zoom(order=1)``. ``bicubic``
    follows timm (half-pixel centres). Computed in at least float32.
    """
    new_grid = _check_grid(tuple(new_grid), "new_grid")
    if tuple(grid.shape[-3:-1]) == new_grid:
        return grid
    lead, (gh, gw, c) = grid.shape[:-3], grid.shape[-3:]
    dtype = grid.dtype
    work = grid.reshape(-1, gh, gw, c).permute(0, 3, 1, 2)
    if not work.dtype.is_floating_point or work.dtype in (torch.float16, torch.bfloat16):
        work = work.float()
    if method == "bilinear":
        out = F.interpolate(work, size=new_grid, mode="bilinear", align_corners=True)
    elif method == "bicubic":
        out = F.interpolate(work, size=new_grid, mode="bicubic", align_corners=False, antialias=antialias)
    else:
        raise ConfigError(f"unknown resize method {method!r}: use 'bilinear' (authors) or 'bicubic' (timm)")
    out = out.permute(0, 2, 3, 1).reshape(*lead, *new_grid, c)
    return out.to(dtype)


def resize_pos_embed(posemb: torch.Tensor, old_grid: Sequence[int], new_grid: Sequence[int],
                     num_prefix_tokens: int = 1, method: str = "bilinear",
                     antialias: bool = False) -> torch.Tensor:
    """Resize a learned 1D position table [n, prefix + rows*cols, D] to a new grid.

    The prefix (class-token) slots are kept untouched; the patch slots are
    viewed as the row-major 2D grid they came from, resized, and flattened
    back. Both grids are given explicitly, so non-square grids work.
    """
    old_grid = _check_grid(tuple(old_grid), "old_grid")
    new_grid = _check_grid(tuple(new_grid), "new_grid")
    if posemb.ndim != 3:
        raise InputError(f"position embeddings must be [n, tokens, width], got shape {tuple(posemb.shape)}")
    n_old = old_grid[0] * old_grid[1]
    if posemb.shape[1] != num_prefix_tokens + n_old:
        raise InputError(
            f"position table has {posemb.shape[1]} slots but old grid {old_grid[0]}x{old_grid[1]} plus "
            f"{num_prefix_tokens} prefix token(s) needs {num_prefix_tokens + n_old}: pass the grid the table "
            f"was trained with")
    prefix, patches = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    grid = patches.reshape(posemb.shape[0], *old_grid, posemb.shape[-1])
    grid = resize_grid(grid, new_grid, method, antialias)
    return torch.cat([prefix, grid.reshape(posemb.shape[0], -1, posemb.shape[-1])], dim=1)


def infer_square_grid(num_slots: int, num_prefix_tokens: int) -> Grid:
    n = num_slots - num_prefix_tokens
    side = int(round(n ** 0.5))
    if side * side != n or n <= 0:
        raise InputError(
            f"cannot infer the patch grid of a {num_slots}-slot position table ({num_prefix_tokens} prefix): "
            f"it is not square, pass the original grid (rows, columns) explicitly")
    return side, side


def sincos_2d(grid: Sequence[int], width: int, temperature: float = 10000.0,
              dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Fixed 2D sine-cosine embedding [rows*cols, width] (big_vision layout: sin x, cos x, sin y, cos y)."""
    gh, gw = _check_grid(tuple(grid), "grid")
    if width % 4:
        raise ConfigError(f"sincos2d needs a width divisible by 4, got {width}")
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64, device=device),
                          torch.arange(gw, dtype=torch.float64, device=device), indexing="ij")
    quarter = width // 4
    omega = torch.arange(quarter, dtype=torch.float64, device=device) / max(quarter - 1, 1)
    omega = 1.0 / (temperature ** omega)
    y = y.reshape(-1, 1) * omega
    x = x.reshape(-1, 1) * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).to(dtype)


def sincos_table(grid: Sequence[int], width: int, num_prefix_tokens: int = 0, device=None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`sincos_2d` as an additive table [1, prefix + rows*cols, width] whose prefix slots are zero."""
    pe = sincos_2d(grid, width, dtype=dtype, device=device)
    if num_prefix_tokens:
        pe = torch.cat([pe.new_zeros(num_prefix_tokens, pe.shape[1]), pe], dim=0)
    return pe.unsqueeze(0)


def resize_axis(table: torch.Tensor, size: int, axis: int, method: str = "bilinear") -> torch.Tensor:
    """Resize one half of a learned 2D embedding, [n, rows, D/2] (``axis`` 0) or [n, cols, D/2] (``axis`` 1),
    to ``size`` slots along its grid axis."""
    if axis == 0:
        return resize_grid(table.unsqueeze(2), (size, 1), method).squeeze(2)
    return resize_grid(table.unsqueeze(1), (1, size), method).squeeze(1)


def learn2d_table(row: torch.Tensor, col: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 0,
                  method: str = "bilinear") -> torch.Tensor:
    """The learned 2D embedding (App. D.4) as an additive table [n, prefix + rows*cols, D]: each patch gets
    its row's half [n, rows, D/2] and its column's half, concatenated (resized to ``grid`` when it differs);
    the prefix slots are zero."""
    row, col = resize_axis(row, grid[0], 0, method), resize_axis(col, grid[1], 1, method)
    n, h = row.shape[0], row.shape[-1]
    pe = torch.cat([row[:, :, None].expand(n, grid[0], grid[1], h),
                    col[:, None].expand(n, grid[0], grid[1], h)], dim=-1).reshape(n, -1, 2 * h)
    if num_prefix_tokens:
        pe = torch.cat([pe.new_zeros(n, num_prefix_tokens, 2 * h), pe], dim=1)
    return pe

class RelativePositionBias(nn.Module):
    """A learned attention-logit bias per head and per 2D offset between patches.

    ``table`` holds one value per head for every offset (dy, dx) on the grid,
    [heads, 2*rows-1, 2*cols-1]; with a class token, ``cls`` adds three learned
    biases per head: class->patch, patch->class and class->class.
    """

    def __init__(self, grid: Grid, num_heads: int, class_token: bool):
        super().__init__()
        self.grid = _check_grid(tuple(grid), "grid")
        gh, gw = self.grid
        self.table = nn.Parameter(torch.zeros(num_heads, 2 * gh - 1, 2 * gw - 1))
        self.cls = nn.Parameter(torch.zeros(num_heads, 3)) if class_token else None

    def forward(self, grid: Optional[Grid] = None, method: str = "bilinear") -> torch.Tensor:
        """Bias [heads, tokens, tokens] for a patch grid (the built one by default)."""
        gh, gw = grid or self.grid
        table = self.table
        if (gh, gw) != self.grid:
            table = resize_grid(table.unsqueeze(-1), (2 * gh - 1, 2 * gw - 1), method).squeeze(-1)
        dev = table.device
        ys, xs = torch.meshgrid(torch.arange(gh, device=dev), torch.arange(gw, device=dev), indexing="ij")
        ys, xs = ys.reshape(-1), xs.reshape(-1)
        dy = ys[:, None] - ys[None, :] + gh - 1
        dx = xs[:, None] - xs[None, :] + gw - 1
        bias = table[:, dy, dx]  # [H, N, N]
        if self.cls is None:
            return bias
        h, n = bias.shape[0], bias.shape[1]
        full = bias.new_empty(h, n + 1, n + 1)
        full[:, 1:, 1:] = bias
        full[:, 0, 1:] = self.cls[:, 0:1]
        full[:, 1:, 0] = self.cls[:, 1:2]
        full[:, 0, 0] = self.cls[:, 2]
        return full


def resize_relative_table(table: torch.Tensor, new_grid: Sequence[int], method: str = "bilinear") -> torch.Tensor:
    """Resize a [heads, 2*rows-1, 2*cols-1] offset table for a new patch grid."""
    gh, gw = _check_grid(tuple(new_grid), "new_grid")
    return resize_grid(table.unsqueeze(-1), (2 * gh - 1, 2 * gw - 1), method).squeeze(-1)
