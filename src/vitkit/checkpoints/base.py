"""What every format reader returns, and the config inference they share.

A :class:`Checkpoint` is weights already in vitkit's key layout, the config
they imply, and what the source said about labels and preprocessing. The
``layout`` dict remembers how the source spelled things (npz flavour and
prefix, whether the position table had a class slot, ...) so that writing
back to the same format reproduces the original tensors exactly.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..config import SIZES, ViTConfig
from ..errors import CheckpointError
from ..models.adapt import fold_class_slots
from ..models.cost import variant_fields


@dataclass
class Checkpoint:
    state: Dict[str, Tensor]
    config: ViTConfig
    format: str  # vitkit | npz | torchvision | timm | hf
    labels: Optional[List[str]] = None
    preprocessing: Optional[Dict[str, Any]] = None  # a Preset.to_dict(), or None
    layout: Dict[str, Any] = field(default_factory=dict)
    source: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    # config fields the source does not store, which the reader assumed (e.g. a timm state dict's GELU and
    # LayerNorm epsilon, a head count): a model name asked for with the weights supplies them
    assumed: Tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: format, flavour, sizes, resolution, classes and extra tokens."""
        c = self.config
        return (f"{self.format} checkpoint{' ' + self.layout.get('flavour') if self.layout.get('flavour') else ''}: "
                f"width {c.width}, depth {c.depth}, heads {c.num_heads}, patch {c.patch_size[0]}, "
                f"{c.img_size[0]}x{c.img_size[1]} px, {c.num_classes} classes"
                f"{', pre-logits ' + str(c.representation_size) if c.representation_size else ''}"
                f"{', distillation token' if c.distill_token else ''}"
                + "".join(f", {k}={v}" for k, v in variant_fields(c).items()))


class HeadsUnknown(CheckpointError):
    """The weights do not store their head count and no rule gives it for their width."""

    def __init__(self, message: str, width: int) -> None:
        super().__init__(message)
        self.width = width


def standard_num_heads(width: int) -> Optional[int]:
    """The heads of the standard size (Table 1, Ti, S) with this width; None for any other width."""
    for dims in SIZES.values():
        if dims["width"] == width:
            return dims["num_heads"]
    return None


def guess_num_heads(width: int) -> int:
    """Heads are not stored in torchvision/timm/OpenCLIP weights: the standard size with this width, else
    64-dim heads (what reading and converting need: the tensors do not depend on the head count); a width
    not divisible by 64 raises :class:`HeadsUnknown`. ``create_model(weights=...)`` without a name accepts
    only the standard sizes (:func:`standard_num_heads`)."""
    heads = standard_num_heads(width)
    if heads is not None:
        return heads
    if width % 64 == 0:
        return width // 64
    raise heads_unknown(width, guessed=True)


def heads_unknown(width: int, guessed: bool = False) -> HeadsUnknown:
    """The error for weights that do not store their head count and whose width is not a standard size's
    (``guessed``: nor divisible by 64, the reader's fallback)."""
    known = ", ".join(f"{d['width']} ({d['num_heads']} heads)" for d in SIZES.values())
    return HeadsUnknown(f"the weights do not store their number of heads and width {width} is not a standard "
                        f"size's ({known}){' nor divisible by 64' if guessed else ''}: pass num_heads= "
                        f"(--num-heads), or the model's name", width)


def square_grid(n: int) -> Optional[int]:
    side = int(round(math.sqrt(n)))
    return side if side * side == n and n > 0 else None


PREFIX_KEYS = ("cls_token", "dist_token")  # the tokens before the patches, in order
LAYER_SCALE_INIT = 1e-5  # LayerScale's initial value where weights carry a scale (timm's and DINOv2's default)


def add_class_slot(state: Dict[str, Tensor]) -> bool:
    """If the position table has no slot for the class (and distillation) token (big_vision, timm
    no_embed_class), add zero ones: the tokens then get no position, exactly as in the source. Returns
    whether slots were added."""
    pe = state.get("pos_embed")
    prefix = sum(k in state for k in PREFIX_KEYS)
    if pe is None or "cls_token" not in state:
        return False
    n = pe.shape[-2]
    if square_grid(n) and not square_grid(n - prefix):
        state["pos_embed"] = torch.cat([pe.new_zeros(pe.shape[0], prefix, pe.shape[-1]), pe], dim=1)
        return True
    return False


def drop_class_slot(state: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """The inverse of :func:`add_class_slot` for writing: each slot's value is folded into its token (the
    sum is what the model adds), so the function computed is unchanged."""
    if state.get("pos_embed") is None or state.get("cls_token") is None:
        return dict(state)
    return fold_class_slots(state, sum(k in state for k in PREFIX_KEYS))


def descendant_parts(cfg: ViTConfig) -> List[str]:
    """The parts of ``cfg`` beyond the paper's ViT (which the torchvision, .npz and HF ViT layouts cannot
    hold; timm's can, and HF's DINOv2 / CLIP / SigLIP towers each hold theirs)."""
    parts = [what for what, on in (
        (f"{cfg.reg_tokens} register tokens", cfg.reg_tokens), ("layer scale", cfg.layer_scale is not None),
        ("a LayerNorm before the blocks", cfg.norm_pre), (f"final_norm={cfg.final_norm!r}", cfg.final_norm != "tokens"),
        ("attention pooling (pool='map')", cfg.pool == "map"), ("QuickGELU", cfg.gelu == "quick"),
        ("no patch-embedding bias", not cfg.patch_bias)) if on]
    return parts


def with_class_slots(state: Dict[str, Tensor], cfg: ViTConfig) -> Dict[str, Tensor]:
    """For a layout whose position table has slots for the class (and distillation) token: a model without
    them (``posemb_class_slot=False``) gets zero ones, the same function."""
    tokens = int(cfg.class_token) + int(cfg.distill_token)
    pe = state.get("pos_embed")
    if cfg.posemb_class_slot or not tokens or pe is None:
        return state
    return {**state, "pos_embed": torch.cat([pe.new_zeros(pe.shape[0], tokens, pe.shape[-1]), pe], dim=1)}


def infer_config(state: Dict[str, Tensor], *, num_heads: Optional[int] = None, img_size=None,
                 **fixed: Any) -> ViTConfig:
    """Build the ViTConfig a vitkit-keyed state dict implies (shapes only), plus ``fixed`` fields.

    The image size comes from the square position table times the patch size
    unless ``img_size`` is given (non-square tables need it).
    """
    try:
        w = state["patch_embed.proj.weight"]
    except KeyError:
        raise CheckpointError("no patch embedding in the weights: not a ViT checkpoint") from None
    width, in_chans, ph, pw = (int(s) for s in w.shape)
    depth = 0
    while f"blocks.{depth}.norm1.weight" in state:
        depth += 1
    if depth == 0:
        raise CheckpointError("no encoder blocks in the weights: not a ViT checkpoint")
    class_token = "cls_token" in state
    distill_token = "dist_token" in state  # DeiT's distillation token (timm / HF distilled models)
    prefix = sum(k in state for k in PREFIX_KEYS)
    fields: Dict[str, Any] = dict(
        width=width, in_chans=in_chans, patch_size=(ph, pw), depth=depth,
        mlp_dim=int(state["blocks.0.mlp.fc1.weight"].shape[0]),
        num_heads=num_heads or guess_num_heads(width), class_token=class_token, distill_token=distill_token,
        # a distilled model with a class head but no distillation head reads out the class token only
        distill_head=not distill_token or "head_dist.weight" in state or "head.weight" not in state,
        pool="token" if class_token else "map" if "attn_pool.latent" in state else "gap",
        qkv_bias="blocks.0.attn.qkv.bias" in state, patch_bias="patch_embed.proj.bias" in state,
        norm_pre="norm_pre.weight" in state,
        final_norm="tokens" if "norm.weight" in state else "pooled" if "fc_norm.weight" in state else "none")
    if "reg_token" in state:
        fields["reg_tokens"] = int(state["reg_token"].shape[1])
    if "blocks.0.ls1.gamma" in state:  # LayerScale: the weights do not say its initial value; timm's default
        fields["layer_scale"] = LAYER_SCALE_INIT
    if "attn_pool.latent" in state and class_token:
        fields["pool"] = "map"
    from .formats.hybrid import backbone_fields
    hybrid = backbone_fields(state)  # a hybrid's ResNet: stages, width, input channels
    fields.update(hybrid)
    stride = ViTConfig(**hybrid, patch_size=1).feature_stride if hybrid else 1
    pe = state.get("pos_embed")
    if img_size is not None:
        fields["img_size"] = img_size
    elif pe is not None:
        side = square_grid(pe.shape[-2] - prefix)
        if side is None:
            raise CheckpointError(
                f"the position table has {pe.shape[-2]} slots, not a square grid plus {prefix} token slot(s): "
                f"pass img_size=(height, width) of the checkpoint")
        fields["img_size"] = (side * ph * stride, side * pw * stride)
    if pe is None:
        fields["posemb"] = "none"
    if "pre_logits.fc.weight" in state:
        fields["representation_size"] = int(state["pre_logits.fc.weight"].shape[0])
    fields["num_classes"] = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    fields.update(fixed)
    if not hybrid and not fields.get("dynamic_img_pad") and _uneven(fields.get("img_size"), (ph, pw)):
        fields.setdefault("crop_remainder", True)  # the source's stride-P convolution does not read the rest
    return ViTConfig(**fields)


def _uneven(size, patch: Tuple[int, int]) -> bool:
    """A stored image size of no whole patch count (SigLIP so400m: 384 px in 14 px patches)."""
    if size is None:
        return False
    h, w = (size, size) if isinstance(size, int) else size
    return bool(h % patch[0] or w % patch[1])


def layout_for(ckpt: Checkpoint, fmt: str) -> Dict[str, Any]:
    """How ``ckpt`` was spelled in ``fmt`` when it came from there (directly or via a vitkit folder)."""
    if ckpt.format == fmt or ckpt.layout.get("source_format") == fmt:
        return dict(ckpt.layout)
    return {}


def heads_note(cfg: ViTConfig) -> str:
    return (f"num_heads={cfg.num_heads} assumed (the weights do not store it; standard for width {cfg.width}): "
            f"pass num_heads= if the model was trained with another head count")


def warn_numerics(cfg, target: str, ln_eps: float, gelu: str) -> None:
    """The tensors convert exactly, but the target library computes with its own epsilon / GELU."""
    if cfg.ln_eps != ln_eps or cfg.gelu != gelu:
        warnings.warn(f"{target} computes with LayerNorm eps {ln_eps} and {gelu} GELU; these weights come from "
                      f"a model with eps {cfg.ln_eps} and {cfg.gelu} GELU, so its logits there will differ "
                      f"slightly (the tensors themselves are copied exactly)", stacklevel=3)
