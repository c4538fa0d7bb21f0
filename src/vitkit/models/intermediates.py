"""What :meth:`VisionTransformer.forward_intermediates` and :meth:`~VisionTransformer.forward_feature_maps`
do with the blocks' outputs: choose the blocks, lay their tokens out as timm does, scale them into a pyramid."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..errors import InputError

Grid = Tuple[int, int]


def resolve_indices(indices: Union[None, int, Sequence[int]], depth: int) -> List[int]:
    """Sorted block indices: None for every block, an int n for the last n, or a list (negative indices count
    from the end)."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise InputError(f"asked for the last {indices} blocks of a {depth}-block model")
        return list(range(depth - indices, depth))
    out = []
    for i in indices:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise InputError(f"block index {i} is out of range for a {depth}-block model")
        out.append(j)
    return sorted(set(out))


def check_output_fmt(output_fmt: Optional[str]) -> None:
    if output_fmt is not None and output_fmt not in ("NCHW", "NLC"):
        raise InputError(f"output_fmt={output_fmt!r}: use 'NCHW' (maps) or 'NLC' (token sequences)")


def timm_layout(tokens: List[torch.Tensor], grid: Grid, num_prefix_tokens: int, output_fmt: str,
                return_prefix_tokens: bool = False) -> list:
    """Each [B, prefix + N, D] token sequence as its patch tokens, a map [B, D, rows, cols] ("NCHW") or
    [B, N, D] ("NLC"), paired with its prefix tokens [B, prefix, D] as ``(map, prefix)`` when
    ``return_prefix_tokens`` (and the model has prefix tokens)."""
    p = num_prefix_tokens
    out = [y[:, p:] for y in tokens]
    if output_fmt == "NCHW":
        out = [y.reshape(y.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous() for y in out]
    if return_prefix_tokens and p:
        out = [(y, t[:, :p]) for y, t in zip(out, tokens)]
    return out


def feature_pyramid(maps: List[torch.Tensor], scales: Sequence[float]) -> List[torch.Tensor]:
    """One scale per map [B, D, rows, cols]: up by bilinear interpolation, down (1/k for a whole k) by average
    pooling; 1 leaves the map as it is."""
    if len(scales) != len(maps):
        raise InputError(f"{len(scales)} scales for {len(maps)} feature maps: give one per map")
    out = []
    for m, s in zip(maps, scales):
        if s > 1:
            m = F.interpolate(m, scale_factor=float(s), mode="bilinear", align_corners=False)
        elif s < 1:
            k = round(1 / s)
            if abs(k * s - 1) > 1e-9:
                raise InputError(f"scale {s}: a down-scale must be 1/k for a whole k")
            m = F.avg_pool2d(m, k, ceil_mode=True)
        out.append(m)
    return out
