"""timm's ``VisionTransformer`` state dicts (``.pth``, ``.bin`` or ``.safetensors``).

timm's names are vitkit's own (fused ``attn.qkv``, ``mlp.fc1/fc2``); older
timm files also carry ``pre_logits.fc``. timm uses LayerNorm eps 1e-6 and
exact GELU; heads are not stored (the standard size for the width is assumed).
Files written with ``no_embed_class=True`` (no class slot in ``pos_embed``)
are read too. A GAP model corresponds to timm's ``global_pool='avg',
fc_norm=False`` (final norm, then the mean of the patch tokens). DeiT's distilled models
(``VisionTransformerDistilled``: ``dist_token``, ``head_dist``) are read and written, and so are the
descendants' parts: LayerScale (``ls1/ls2.gamma``), register tokens (``reg_token``), CLIP's
``norm_pre`` and bias-less patch projection, ``fc_norm`` and the MAP head (``attn_pool``). What the keys
cannot say (QuickGELU, CLIP's eps 1e-5 beside its ``norm_pre``) comes from a model name
(``vitkit.create_model(NAME, weights=FILE)``). The DINOv2 repository's torch.hub files
(``register_tokens``, a ``mask_token`` that is dropped) are read too. QK norm, SwiGLU and other
extensions are reported as unrecognised.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ...errors import CheckpointError
from ...models.adapt import fold_class_slots
from ..base import Checkpoint, add_class_slot, drop_class_slot, heads_note, infer_config, layout_for, warn_numerics
from ..files import write_safetensors, write_torch
from ..keymap import Context, Rule, check_mapped, count_blocks, from_vitkit, linear, rule, to_vitkit
from . import hybrid, timm_folder

NAME = "timm"
B = "blocks.{i}."
RULES: List[Rule] = [
    rule("patch_embed.proj.weight", "patch_embed.proj.weight"),
    rule("patch_embed.proj.bias", "patch_embed.proj.bias", optional=True),  # OpenAI CLIP has none
    rule("cls_token", "cls_token", optional=True),
    rule("dist_token", "dist_token", optional=True),  # VisionTransformerDistilled (DeiT)
    # register tokens: timm's name, and the DINOv2 repository's (its torch.hub files are timm's layout otherwise)
    rule("reg_token", "reg_token", aliases=["register_tokens"], optional=True),
    rule("pos_embed", "pos_embed", optional=True),
    *linear("norm_pre", "norm_pre", optional=True),  # CLIP's ln_pre
    *linear("blocks.{i}.norm1", B + "norm1"),
    rule("blocks.{i}.attn.qkv.weight", B + "attn.qkv.weight"),
    rule("blocks.{i}.attn.qkv.bias", B + "attn.qkv.bias", optional=True),
    *linear("blocks.{i}.attn.proj", B + "attn.proj"),
    rule("blocks.{i}.ls1.gamma", B + "ls1.gamma", optional=True),  # LayerScale (DeiT III, DINOv2)
    *linear("blocks.{i}.norm2", B + "norm2"),
    *linear("blocks.{i}.mlp.fc1", B + "mlp.fc1"),
    *linear("blocks.{i}.mlp.fc2", B + "mlp.fc2"),
    rule("blocks.{i}.ls2.gamma", B + "ls2.gamma", optional=True),
    *linear("norm", "norm", optional=True),
    *linear("fc_norm", "fc_norm", optional=True),  # the final norm after pooling
    rule("attn_pool.latent", "attn_pool.latent", optional=True),  # MAP head (SigLIP)
    *(r for name in ("q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2")
      for r in linear(f"attn_pool.{name}", f"attn_pool.{name}", optional=True)),
    *linear("pre_logits.fc", "pre_logits.fc", optional=True),
    *linear("head", "head", optional=True),
    *linear("head_dist", "head_dist", optional=True),
]
DEPTH_KEY = B + "norm1.weight"


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return RULES


def read(tensors: Dict[str, Any], *, num_heads: Optional[int] = None, source: str = "", img_size=None) -> Checkpoint:
    depth = count_blocks(tensors, DEPTH_KEY)
    notes = []
    if "mask_token" in tensors and "blocks.0.ls1.gamma" in tensors:  # the DINOv2 repository's own files
        tensors = {k: v for k, v in tensors.items() if k != "mask_token"}
        notes.append("DINOv2's mask token (used only in masked pre-training) dropped")
    extra, numerics = hybrid.read_rules(tensors, NAME)  # a hybrid's ResNet, if any
    mapped = to_vitkit(tensors, RULES + extra, depth, Context(1, 1))
    check_mapped(mapped, source, NAME)
    state = mapped.state
    slot_added = add_class_slot(state)
    eps = 1e-6
    if "norm_pre.weight" in state:  # timm's towers with a LayerNorm before the blocks are CLIP's: eps 1e-5
        eps = 1e-5
        notes.append("a LayerNorm before the blocks (CLIP's ln_pre): LayerNorm eps 1e-5 and exact GELU assumed "
                     "(OpenAI's CLIP computes QuickGELU: ask for a *_quickgelu_* name or pass gelu='quick')")
    cfg = infer_config(state, num_heads=num_heads, img_size=img_size, ln_eps=eps, gelu="exact", **numerics)
    layout = {"flavour": "timm", "posemb_class_slot": not slot_added}
    if not num_heads:
        notes.append(heads_note(cfg))
    assumed = ("ln_eps", "gelu") + (() if num_heads else ("num_heads",))
    return Checkpoint(state, cfg, NAME, layout=layout, source=source, notes=notes, assumed=assumed)


def numerics(cfg) -> Dict[str, Any]:
    """The LayerNorm epsilon and GELU timm computes a model of this shape with: its CLIP towers (a norm
    before the blocks) use eps 1e-5 and exact or QuickGELU (by name), every other ViT eps 1e-6, exact GELU."""
    if cfg.norm_pre:
        return {"ln_eps": 1e-5, "gelu": cfg.gelu if cfg.gelu in ("exact", "quick") else "exact"}
    return {"ln_eps": 1e-6, "gelu": "exact"}


def read_folder(tensors: Dict[str, Any], config: Dict[str, Any], *, num_heads: Optional[int] = None,
                source: str = "") -> Checkpoint:
    """A timm Hub folder (see :mod:`.timm_folder`): the weights plus what config.json says of the model
    (heads, read-out, input size), its class names and its evaluation preprocessing."""
    heads, fields, notes = timm_folder.model_fields(config)
    size = timm_folder.image_size(config)
    ckpt = read(tensors, num_heads=num_heads or heads, source=source, img_size=size)
    pe = ckpt.state.get("pos_embed")
    if size and pe is not None and pe.shape[-2] != ckpt.config.seq_len:  # input_size is not the table's size
        ckpt = read(tensors, num_heads=num_heads or heads, source=source)
        notes.append(f"config.json's input size {size} does not fit the position table: the table's "
                     f"{ckpt.config.img_size} is used")
    if fields:
        ckpt.config = ckpt.config.replace(**fields)
        pe = ckpt.state.get("pos_embed")
        extra = 0 if pe is None else pe.shape[-2] - ckpt.config.posemb_len
        if extra > 0 and not ckpt.config.posemb_class_slot:  # no_embed_class: the zero slot read() added goes
            ckpt.state = fold_class_slots(ckpt.state, extra)
    ckpt.notes.extend(notes)
    ckpt.labels = timm_folder.labels(config, ckpt.config.num_classes)
    ckpt.preprocessing = timm_folder.preprocessing(config, ckpt.notes)
    ckpt.layout["folder"] = True
    return ckpt


def write(ckpt: Checkpoint, dst: Path, *, safetensors: bool = False) -> Path:
    """A state-dict file (``.pth``, or ``.safetensors`` with ``safetensors=True``), or, when ``dst`` is not a
    weights file name, a timm Hub folder (model.safetensors + config.json; see :mod:`.timm_folder`)."""
    cfg = ckpt.config
    folder = timm_folder.is_folder(Path(dst))
    if folder:
        timm_folder.model_args(ckpt)  # refuses what timm's folders cannot describe, before anything is written
    if cfg.posemb not in ("learn", "none") or cfg.posemb_where != "input":
        raise CheckpointError(f"timm's VisionTransformer has learned 1D position embeddings at the input; this model "
                              f"has posemb={cfg.posemb}, posemb_where={cfg.posemb_where}: use --to vitkit")
    if cfg.distill_token and not cfg.distill_head and cfg.num_classes:
        raise CheckpointError("timm's distilled DeiT reads out both tokens (head and head_dist); this model reads out "
                         "the class token only (distill_head=False, e.g. from HF's DeiTForImageClassification): "
                              "use --to vitkit or hf")
    warn_numerics(cfg, "timm", **numerics(cfg))
    state = ckpt.state
    if cfg.posemb_class_slot and layout_for(ckpt, NAME).get("posemb_class_slot") is False:
        state = drop_class_slot(state)
    mapped = from_vitkit(state, RULES + hybrid.write_rules(cfg, NAME), cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"timm has no place for {mapped.unused}")
    if folder:
        return timm_folder.write(ckpt, mapped.state, Path(dst))
    return write_safetensors(mapped.state, dst) if safetensors else write_torch(mapped.state, dst)
