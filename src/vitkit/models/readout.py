"""The last encoder block computed for the tokens the head reads only.

With token pooling the logits read the class token (and a distillation token) of the last block alone.
:meth:`VisionTransformer.forward` therefore runs that block's queries, attention rows, output projection and
MLP for those rows only, every token still a key and a value: the same sums for every row computed, one row
in 197 of the last block at B/16 (about 7% of the encoder's products skipped), in inference and in training
(the rows not computed would get no gradient, so every gradient is the same too), eager or under
``torch.compile``. Whatever would see the difference gets every token: ``forward_features``, intermediates,
attention maps, the graph consumers that hand the graph on (``torch.export``, ONNX export, tracing, the FLOP
counter), int8 layers (they quantise activations per call, over all rows) and any forward or backward hook.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .layers import Block


def hooked(model: nn.Module) -> bool:
    """Whether a forward hook (global or on any of ``model``'s modules) or a backward hook could watch a call."""
    glob = torch.nn.modules.module
    if any(getattr(glob, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                   "_global_backward_hooks", "_global_backward_pre_hooks")):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or getattr(m, "_backward_pre_hooks", None)
               for m in model.modules())


def readout_rows(model) -> Optional[int]:
    """How many leading tokens ``model``'s logits read from its last block (``config.head_rows``), or None where
    they read every token, the last block is not a plain :class:`Block` of ``nn.Linear`` layers or a hook
    watches a module (:func:`hooked`)."""
    rows = model.config.head_rows
    blk = model.blocks[-1] if len(model.blocks) else None
    if rows is None or type(blk) is not Block or any(
            type(lin) is not nn.Linear for lin in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2)):
        return None
    return None if hooked(model) else rows
