"""torchvision's ``VisionTransformer`` state dicts (``vit_b_16-c867db91.pth`` ...).

Packed attention (``in_proj_weight`` rows q; k; v, the same order as vitkit's
fused qkv), ``mlp.0`` / ``mlp.3`` (older files: ``mlp.linear_1`` /
``mlp.linear_2``), ``heads.head`` and the optional ``heads.pre_logits``.
torchvision uses LayerNorm eps 1e-6 and exact GELU; the number of heads is not
stored in the weights (the standard size for the width is assumed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ...errors import CheckpointError
from ..base import Checkpoint, descendant_parts, heads_note, infer_config, warn_numerics, with_class_slots
from ..files import write_safetensors, write_torch
from ..keymap import Context, Rule, check_mapped, count_blocks, from_vitkit, linear, rule, to_vitkit

NAME = "torchvision"
L = "encoder.layers.encoder_layer_{i}."
RULES: List[Rule] = [
    *linear("patch_embed.proj", "conv_proj"),
    rule("cls_token", "class_token"),
    rule("pos_embed", "encoder.pos_embedding"),
    *linear("blocks.{i}.norm1", L + "ln_1"),
    rule("blocks.{i}.attn.qkv.weight", L + "self_attention.in_proj_weight"),
    rule("blocks.{i}.attn.qkv.bias", L + "self_attention.in_proj_bias"),
    *linear("blocks.{i}.attn.proj", L + "self_attention.out_proj"),
    *linear("blocks.{i}.norm2", L + "ln_2"),
    *linear("blocks.{i}.mlp.fc1", L + "mlp.0", aliases=[L + "mlp.linear_1"]),
    *linear("blocks.{i}.mlp.fc2", L + "mlp.3", aliases=[L + "mlp.linear_2"]),
    *linear("norm", "encoder.ln"),
    *linear("pre_logits.fc", "heads.pre_logits", optional=True),
    *linear("head", "heads.head", optional=True),
]
DEPTH_KEY = L + "ln_1.weight"


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return RULES


def read(tensors: Dict[str, Any], *, num_heads: Optional[int] = None, source: str = "") -> Checkpoint:
    depth = count_blocks(tensors, DEPTH_KEY)
    mapped = to_vitkit(tensors, RULES, depth, Context(1, 1))
    check_mapped(mapped, source, NAME)
    cfg = infer_config(mapped.state, num_heads=num_heads, ln_eps=1e-6, gelu="exact")
    notes = [] if num_heads else [heads_note(cfg)]
    return Checkpoint(mapped.state, cfg, NAME, layout={"flavour": "torchvision"}, source=source, notes=notes,
                      assumed=() if num_heads else ("num_heads",))


def write(ckpt: Checkpoint, dst: Path, *, safetensors: bool = False) -> Path:
    cfg = ckpt.config
    _require(cfg)
    mapped = from_vitkit(with_class_slots(ckpt.state, cfg), RULES, cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"torchvision has no place for {mapped.unused}")
    return write_safetensors(mapped.state, dst) if safetensors else write_torch(mapped.state, dst)


def _require(cfg) -> None:
    hard = []
    if not cfg.class_token or cfg.pool != "token":
        hard.append("a class token read-out (pool='token')")
    if cfg.posemb != "learn" or cfg.posemb_where != "input":
        hard.append("learned 1D position embeddings added at the input")
    if not cfg.qkv_bias:
        hard.append("qkv biases")
    if cfg.img_size[0] != cfg.img_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        hard.append("square images and patches")
    if cfg.backbone:
        hard.append("no hybrid ResNet backbone (torchvision has no ResNet+ViT; write hybrids as vitkit, npz or timm)")
    if cfg.distill_token:
        hard.append("no distillation token (DeiT; write it as vitkit, timm or hf)")
    hard.extend(f"no {p}" if not p.startswith("no ") else "a patch-embedding bias" for p in descendant_parts(cfg))
    if hard:
        raise CheckpointError(f"torchvision's VisionTransformer needs {'; '.join(hard)}: this model cannot be "
                              f"written in its layout (use --to vitkit, or hf / timm where they fit)")
    warn_numerics(cfg, "torchvision", ln_eps=1e-6, gelu="exact")
