"""timm's ``VisionTransformer`` state dicts (``.pth``, ``.bin`` or ``.safetensors``).

timm's names are vitkit's own (fused ``attn.qkv``, ``mlp.fc1/fc2``); older
timm files also carry ``pre_logits.fc``. timm uses LayerNorm eps 1e-6 and
exact GELU; heads are not stored (the standard size for the width is assumed).
Files written with ``no_embed_class=True`` (no class slot in ``pos_embed``)
are read too. A GAP model corresponds to timm's ``global_pool='avg',
fc_norm=False`` (final norm, then the mean of the patch tokens). DeiT's distilled models
(``VisionTransformerDistilled``: ``dist_token``, ``head_dist``) are read and written. Layer scale,
register tokens, ``fc_norm`` and other timm extensions are not the paper's model and are reported as
unrecognised.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ..base import Checkpoint, heads_note, add_class_slot, drop_class_slot, infer_config, layout_for
from ..files import write_safetensors, write_torch
from ..keymap import Context, Rule, count_blocks, from_vitkit, linear, rule, to_vitkit
from . import hybrid
from .torchvision import check, warn_numerics

NAME = "timm"
B = "blocks.{i}."
RULES: List[Rule] = [
    *linear("patch_embed.proj", "patch_embed.proj"),
    rule("cls_token", "cls_token", optional=True),
    rule("dist_token", "dist_token", optional=True),  # VisionTransformerDistilled (DeiT)
    rule("pos_embed", "pos_embed", optional=True),
    *linear("blocks.{i}.norm1", B + "norm1"),
    rule("blocks.{i}.attn.qkv.weight", B + "attn.qkv.weight"),
    rule("blocks.{i}.attn.qkv.bias", B + "attn.qkv.bias", optional=True),
    *linear("blocks.{i}.attn.proj", B + "attn.proj"),
    *linear("blocks.{i}.norm2", B + "norm2"),
    *linear("blocks.{i}.mlp.fc1", B + "mlp.fc1"),
    *linear("blocks.{i}.mlp.fc2", B + "mlp.fc2"),
    *linear("norm", "norm"),
    *linear("pre_logits.fc", "pre_logits.fc", optional=True),
    *linear("head", "head", optional=True),
    *linear("head_dist", "head_dist", optional=True),
]
DEPTH_KEY = B + "norm1.weight"


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return RULES


def read(tensors: Dict[str, Any], *, num_heads: Optional[int] = None, source: str = "") -> Checkpoint:
    depth = count_blocks(tensors, DEPTH_KEY)
    extra, numerics = hybrid.read_rules(tensors, NAME)  # a hybrid's ResNet, if any
    mapped = to_vitkit(tensors, RULES + extra, depth, Context(1, 1))
    check(mapped, source, NAME)
    state = mapped.state
    slot_added = add_class_slot(state)
    cfg = infer_config(state, num_heads=num_heads, ln_eps=1e-6, gelu="exact", **numerics)
    layout = {"flavour": "timm", "posemb_class_slot": not slot_added}
    return Checkpoint(state, cfg, NAME, layout=layout, source=source, notes=[] if num_heads else [heads_note(cfg)])


def write(ckpt: Checkpoint, dst: Path, *, safetensors: bool = False) -> Path:
    cfg = ckpt.config
    if cfg.posemb not in ("learn", "none") or cfg.posemb_where != "input":
        raise ValueError(f"timm's VisionTransformer has learned 1D position embeddings at the input; this model "
                         f"has posemb={cfg.posemb}, posemb_where={cfg.posemb_where}: use --to vitkit")
    if cfg.distill_token and not cfg.distill_head and cfg.num_classes:
        raise ValueError("timm's distilled DeiT reads out both tokens (head and head_dist); this model reads out "
                         "the class token only (distill_head=False, e.g. from HF's DeiTForImageClassification): "
                         "use --to vitkit or hf")
    warn_numerics(cfg, "timm", ln_eps=1e-6, gelu="exact")
    state = ckpt.state
    if layout_for(ckpt, NAME).get("posemb_class_slot") is False:
        state = drop_class_slot(state)
    mapped = from_vitkit(state, RULES + hybrid.write_rules(cfg, NAME), cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise ValueError(f"timm has no place for {mapped.unused}")
    return write_safetensors(mapped.state, dst) if safetensors else write_torch(mapped.state, dst)
