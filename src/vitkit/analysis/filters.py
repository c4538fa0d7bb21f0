"""Embedding filters (Figure 7 left): the top principal components of the patch embedding E.

E (Eq. 1) maps a flattened P x P x C patch to D numbers; its D rows are
filters in patch space. Their principal components, reshaped back to
C x P x P, show the basis the model uses for the fine structure of a patch.
"""
from __future__ import annotations

from typing import Tuple

import torch

from ..errors import InputError


@torch.no_grad()
def embedding_filters(model: torch.nn.Module, num_components: int = 28) -> Tuple[torch.Tensor, torch.Tensor]:
    """(components [k, C, P, P], explained-variance ratio [k]) of ``patch_embed.proj.weight``.

    The D filters are centred, then decomposed with an SVD; the right
    singular vectors are the principal components, largest first. Signs are
    fixed so that each component's largest-magnitude entry is positive.
    """
    w = model.patch_embed.proj.weight.detach().double()  # [D, C, P, P]
    d, shape = w.shape[0], w.shape[1:]
    flat = w.reshape(d, -1)
    centred = flat - flat.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    k = min(int(num_components), vh.shape[0])
    if k < 1:
        raise InputError(f"num_components must be >= 1, got {num_components}")
    comps = vh[:k]
    sign = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
    comps = comps * sign
    var = s ** 2
    ratio = var[:k] / var.sum().clamp_min(1e-300)
    return comps.reshape(k, *shape).float(), ratio.float()
