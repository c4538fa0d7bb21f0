"""Hugging Face's image towers of the ViT's descendants: ``Dinov2Model`` / ``Dinov2WithRegistersModel``,
``CLIPVisionModel`` (also ``CLIPVisionModelWithProjection`` and the vision half of ``CLIPModel``) and
``SiglipVisionModel`` (and the vision half of ``SiglipModel``): a folder (``config.json`` +
``model.safetensors``) or a raw state dict.

Each is a key table (:data:`TABLES`) plus the few reshapes it needs: CLIP's class embedding and both
position tables are stored without the batch axis; SigLIP's attention-pool head keeps q, k and v in
one ``in_proj`` (vitkit's and timm's MAP head: ``q`` and ``kv``). DINOv2's ``mask_token`` (used only in
its masked pre-training) is dropped on reading and written as zeros. CLIP's projection (no bias) is
vitkit's head with a zero bias. A combined CLIP / SigLIP model's text tower is dropped with a note.

The numerics come from ``config.json`` (GELU flavour: CLIP's ``quick_gelu``, SigLIP's
``gelu_pytorch_tanh``; LayerNorm epsilon; DINOv2's ``layerscale_value``); HF's CLIP applies its
``post_layernorm`` to the pooled class token only (``final_norm="pooled"``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ...errors import CheckpointError
from ...utils import write_json_atomic
from ..base import Checkpoint, heads_note, infer_config, with_class_slots
from ..files import write_safetensors
from ..keymap import QKV_CAT, UNBATCHED, Context, Rule, check_mapped, count_blocks, from_vitkit, linear, rule, to_vitkit

NAME = "hf_towers"
KINDS = ("dinov2", "clip", "siglip")
D = "encoder.layer.{i}."  # DINOv2
N5 = "encoder.layer.{i}.attention."  # transformers 5 in-memory names of DINOv2's attention
L = "encoder.layers.{i}."  # CLIP, SigLIP


def _qkv(ours: str, theirs: str, names=("q_proj", "k_proj", "v_proj"), aliases=()) -> List[Rule]:
    return [rule(f"{ours}.{p}", [f"{theirs}{n}.{p}" for n in names], QKV_CAT,
                 aliases=[[f"{a}{n}.{p}" for n in an] for a, an in aliases]) for p in ("weight", "bias")]


DINOV2: List[Rule] = [
    *linear("patch_embed.proj", "embeddings.patch_embeddings.projection"),
    rule("cls_token", "embeddings.cls_token"),
    rule("reg_token", "embeddings.register_tokens", optional=True),
    rule("pos_embed", "embeddings.position_embeddings"),
    *linear("blocks.{i}.norm1", D + "norm1"),
    *_qkv("blocks.{i}.attn.qkv", D + "attention.attention.", ("query", "key", "value"),
          aliases=[(N5, ("q_proj", "k_proj", "v_proj"))]),
    *linear("blocks.{i}.attn.proj", D + "attention.output.dense", aliases=[N5 + "o_proj"]),
    rule("blocks.{i}.ls1.gamma", D + "layer_scale1.lambda1"),
    *linear("blocks.{i}.norm2", D + "norm2"),
    *linear("blocks.{i}.mlp.fc1", D + "mlp.fc1"),
    *linear("blocks.{i}.mlp.fc2", D + "mlp.fc2"),
    rule("blocks.{i}.ls2.gamma", D + "layer_scale2.lambda1"),
    *linear("norm", "layernorm"),
]
_ENCODER: List[Rule] = [
    *linear("blocks.{i}.norm1", L + "layer_norm1"),
    *_qkv("blocks.{i}.attn.qkv", L + "self_attn."),
    *linear("blocks.{i}.attn.proj", L + "self_attn.out_proj"),
    *linear("blocks.{i}.norm2", L + "layer_norm2"),
    *linear("blocks.{i}.mlp.fc1", L + "mlp.fc1"),
    *linear("blocks.{i}.mlp.fc2", L + "mlp.fc2"),
]
CLIP: List[Rule] = [
    rule("patch_embed.proj.weight", "embeddings.patch_embedding.weight"),
    rule("cls_token", "embeddings.class_embedding", UNBATCHED),
    rule("pos_embed", "embeddings.position_embedding.weight", UNBATCHED),
    *linear("norm_pre", "pre_layrnorm"),
    *_ENCODER,
    *linear("fc_norm", "post_layernorm", optional=True),  # on the pooled class token (CLIPVisionModel)
    *linear("norm", "post_layernorm", optional=True),  # written for a model that normalises every token
]
SIGLIP: List[Rule] = [
    *linear("patch_embed.proj", "embeddings.patch_embedding"),
    rule("pos_embed", "embeddings.position_embedding.weight", UNBATCHED),
    *_ENCODER,
    *linear("norm", "post_layernorm"),
    rule("attn_pool.latent", "head.probe", optional=True),
    *linear("attn_pool.q", "head.attention.in_proj_q", optional=True),  # in_proj split on reading
    *linear("attn_pool.kv", "head.attention.in_proj_kv", optional=True),
    *linear("attn_pool.proj", "head.attention.out_proj", optional=True),
    *linear("attn_pool.norm", "head.layernorm", optional=True),
    *linear("attn_pool.mlp.fc1", "head.mlp.fc1", optional=True),
    *linear("attn_pool.mlp.fc2", "head.mlp.fc2", optional=True),
]
TABLES = {"dinov2": DINOV2, "clip": CLIP, "siglip": SIGLIP}
DEPTH_KEYS = {"dinov2": D + "norm1.weight", "clip": L + "layer_norm1.weight", "siglip": L + "layer_norm1.weight"}
ACTS = {"gelu": "exact", "quick_gelu": "quick", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu_fast": "tanh"}
TEXT = ("text_model.", "text_projection.", "logit_scale", "logit_bias")
PRESETS = {"dinov2": "timm-imagenet", "clip": "clip", "siglip": "hf"}
MODEL_TYPES = {"dinov2": "dinov2", "dinov2_with_registers": "dinov2", "clip": "clip", "clip_vision_model": "clip",
               "siglip": "siglip", "siglip_vision_model": "siglip"}


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return TABLES[(layout or {}).get("kind", "dinov2")]


def strip_prefix(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """A combined model keeps the image tower under ``vision_model.``."""
    return {(k[len("vision_model."):] if k.startswith("vision_model.") else k): v for k, v in tensors.items()}


def kind_of_keys(keys) -> Optional[str]:
    keys = set(keys)
    if "embeddings.class_embedding" in keys:
        return "clip"
    if "embeddings.patch_embedding.weight" in keys:
        return "siglip"
    if any(k.endswith("layer_scale1.lambda1") for k in keys):
        return "dinov2"
    return None


def signature_hits(keys) -> int:
    """How many keys one of the towers' tables takes (format detection)."""
    from ..keymap import signature_hits as hits
    stripped = list(strip_prefix(dict.fromkeys(keys)))
    kind = kind_of_keys(stripped)
    return hits(stripped, TABLES[kind]) + sum(k.startswith(TEXT) for k in keys) if kind else 0


def vision_config(config: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The image tower's part of a config.json (a combined CLIP / SigLIP model nests it)."""
    if not config:
        return None
    return config.get("vision_config") or config if config.get("model_type") in ("clip", "siglip") else config


def is_tower_config(config: Any) -> bool:
    return isinstance(config, dict) and config.get("model_type") in MODEL_TYPES


def read(tensors: Dict[str, Any], *, config: Optional[Dict[str, Any]] = None, num_heads: Optional[int] = None,
         source: str = "") -> Checkpoint:
    notes: List[str] = []
    text = [k for k in tensors if k.startswith(TEXT)]
    if text:
        notes.append(f"the text tower ({len(text)} tensors) dropped: vitkit reads the image tower")
    tensors = strip_prefix({k: v for k, v in tensors.items() if k not in text})
    kind = MODEL_TYPES.get((config or {}).get("model_type", "")) or kind_of_keys(tensors)
    if kind is None:
        raise CheckpointError(f"{source}: not a DINOv2, CLIP or SigLIP image tower")
    head = None
    if kind == "dinov2" and "embeddings.mask_token" in tensors:
        tensors = {k: v for k, v in tensors.items() if k != "embeddings.mask_token"}
        notes.append("DINOv2's mask token (used only in masked pre-training) dropped")
    if kind == "clip" and "visual_projection.weight" in tensors:  # the projection: a head without bias
        tensors = dict(tensors)
        head = tensors.pop("visual_projection.weight")
    if kind == "siglip" and "head.attention.in_proj_weight" in tensors:
        tensors = _split_in_proj(tensors)
    depth = count_blocks(tensors, DEPTH_KEYS[kind])
    mapped = to_vitkit(tensors, TABLES[kind], depth, Context(1, 1))
    if kind == "clip":  # one post_layernorm: read as the norm after pooling
        for p in ("weight", "bias"):
            mapped.state[f"fc_norm.{p}"] = mapped.state.pop(f"norm.{p}")
    check_mapped(mapped, source, f"Hugging Face {kind}")
    state = mapped.state
    if head is not None:
        state["head.weight"], state["head.bias"] = head, head.new_zeros(head.shape[0])
    vc = vision_config(config)
    fixed: Dict[str, Any] = {"ln_eps": {"clip": 1e-5}.get(kind, 1e-6),
                             "gelu": {"clip": "quick", "siglip": "tanh"}.get(kind, "exact"),
                             "posemb_resize": "bicubic"}
    if kind == "dinov2":
        fixed["layer_scale"] = 1.0  # HF's layerscale_value default
    if vc:
        act = vc.get("hidden_act", "gelu")
        if act not in ACTS:
            raise CheckpointError(f"{source}: hidden_act={act!r} is not a GELU vitkit computes ({sorted(ACTS)})")
        fixed["gelu"] = ACTS[act]
        fixed["ln_eps"] = float(vc.get("layer_norm_eps", fixed["ln_eps"]))
        if kind == "dinov2":
            fixed["layer_scale"] = float(vc.get("layerscale_value", 1.0))
            if vc.get("use_swiglu_ffn"):
                raise CheckpointError(f"{source}: a DINOv2 with a SwiGLU MLP (giant) is not a model vitkit builds")
        num_heads = num_heads or int(vc.get("num_attention_heads", 0)) or None
        size = vc.get("image_size")
        if size is not None and kind != "dinov2":  # DINOv2's config says 518 whatever its table holds
            fixed["img_size"] = size
    else:
        notes.append(f"no config.json: {fixed['gelu']} GELU and LayerNorm eps {fixed['ln_eps']} "
                     f"(transformers' {kind} defaults) assumed")
    cfg = infer_config(state, num_heads=num_heads, **fixed)
    if not num_heads:
        notes.append(heads_note(cfg))
    assumed = (() if vc else ("ln_eps", "gelu")) + (() if num_heads else ("num_heads",))
    from ...data.preprocess import get_preset
    # without preprocessor_config.json (read beside config.json when there): each tower's usual pipeline
    pre = get_preset(PRESETS[kind], cfg.img_size).to_dict()
    return Checkpoint(state, cfg, NAME, preprocessing=pre, source=source, notes=notes,
                      layout={"flavour": kind, "kind": kind, "projection": head is not None}, assumed=assumed)


def _split_in_proj(tensors: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(tensors)
    for p in ("weight", "bias"):
        t = out.pop(f"head.attention.in_proj_{p}")
        d = t.shape[0] // 3
        out[f"head.attention.in_proj_q.{p}"], out[f"head.attention.in_proj_kv.{p}"] = t[:d], t[d:]
    return out


def kind_of_config(cfg) -> Optional[str]:
    """Which of the towers a model is, for writing (None: the paper's ViT, written by :mod:`.hf`)."""
    if cfg.pool == "map":
        return "siglip"
    if cfg.norm_pre:
        return "clip"
    if cfg.layer_scale is not None:
        return "dinov2"
    return None


def _problems(cfg, kind: str) -> List[str]:
    out = []
    if cfg.posemb != "learn" or cfg.posemb_where != "input":
        out.append("learned 1D position embeddings at the input")
    if cfg.img_size[0] != cfg.img_size[1] or cfg.patch_size[0] != cfg.patch_size[1]:
        out.append("square images and patches")
    if cfg.backbone or cfg.distill_token or cfg.representation_size:
        out.append("no hybrid stem, distillation token or pre-logits layer")
    if kind == "dinov2":
        if not cfg.class_token or cfg.pool != "token" or cfg.final_norm != "tokens" or not cfg.patch_bias:
            out.append("DINOv2's class-token read-out after a final LayerNorm and a patch bias")
        if cfg.num_classes:
            out.append("no head (Dinov2Model; its classifier reads the class token and the patch mean)")
        if cfg.mlp_dim % cfg.width:
            out.append("an MLP width that is a whole multiple of the width (DINOv2's mlp_ratio)")
    if kind == "clip":
        if not cfg.class_token or cfg.pool != "token" or cfg.patch_bias or cfg.reg_tokens or cfg.final_norm == "none":
            out.append("CLIP's class-token read-out, a final LayerNorm, no patch bias and no register tokens")
        if cfg.layer_scale is not None or not cfg.qkv_bias:
            out.append("no layer scale and q/k/v biases")
    if kind == "siglip":
        if cfg.class_token or cfg.reg_tokens or cfg.final_norm != "tokens" or not cfg.patch_bias:
            out.append("SigLIP's attention pooling of the patches (no class or register tokens) after a final "
                       "LayerNorm, and a patch bias")
        if cfg.num_classes or cfg.layer_scale is not None or cfg.norm_pre or not cfg.qkv_bias:
            out.append("no head, no layer scale, no LayerNorm before the blocks and q/k/v biases")
    return out


HF_ACTS = {"exact": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}


def write(ckpt: Checkpoint, dst: Path, **_: Any) -> Path:
    """A ``save_pretrained``-style folder of the tower the model is (Dinov2Model, Dinov2WithRegistersModel,
    CLIPVisionModel or CLIPVisionModelWithProjection, SiglipVisionModel)."""
    cfg = ckpt.config
    kind = kind_of_config(cfg)
    problems = _problems(cfg, kind)
    head = None
    state = dict(ckpt.state)
    if kind == "clip" and cfg.num_classes:
        head, bias = state.pop("head.weight"), state.pop("head.bias")
        if bool(bias.any()):
            problems.append("a head without bias (CLIP's projection)")
    if problems:
        raise CheckpointError(f"Hugging Face's {kind} tower needs {'; '.join(problems)}: this model cannot be written "
                         f"as an HF folder")
    state = with_class_slots(state, cfg)  # HF's tables have the class slot
    mapped = from_vitkit(state, TABLES[kind], cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"Hugging Face's {kind} tower has no place for {mapped.unused}")
    out = mapped.state
    if kind == "dinov2":
        out["embeddings.mask_token"] = torch.zeros(1, cfg.width, dtype=out["embeddings.cls_token"].dtype)
    if kind == "siglip":
        for p in ("weight", "bias"):
            out[f"head.attention.in_proj_{p}"] = torch.cat([out.pop(f"head.attention.in_proj_q.{p}"),
                                                            out.pop(f"head.attention.in_proj_kv.{p}")], 0)
    if head is not None:
        out["visual_projection.weight"] = head.contiguous()
    arch, model_type = {
        "dinov2": (("Dinov2WithRegistersModel", "dinov2_with_registers") if cfg.reg_tokens
                   else ("Dinov2Model", "dinov2")),
        "clip": ("CLIPVisionModelWithProjection" if head is not None else "CLIPVisionModel", "clip_vision_model"),
        "siglip": ("SiglipVisionModel", "siglip_vision_model")}[kind]
    config: Dict[str, Any] = {
        "architectures": [arch], "model_type": model_type, "hidden_size": cfg.width,
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads, "hidden_act": HF_ACTS[cfg.gelu],
        "layer_norm_eps": cfg.ln_eps, "image_size": cfg.img_size[0], "patch_size": cfg.patch_size[0],
        "num_channels": cfg.in_chans, "attention_dropout": 0.0, "torch_dtype": "float32"}
    if kind == "dinov2":
        config.update(mlp_ratio=cfg.mlp_dim // cfg.width, qkv_bias=cfg.qkv_bias, layerscale_value=cfg.layer_scale,
                      use_swiglu_ffn=False, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      drop_path_rate=0.0, use_mask_token=True)
        if cfg.reg_tokens:
            config["num_register_tokens"] = cfg.reg_tokens
    else:
        config["intermediate_size"] = cfg.mlp_dim
    if kind == "clip":
        config["projection_dim"] = cfg.num_classes or 512
    if kind == "siglip":
        config["vision_use_head"] = True
    folder = Path(dst)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(out, folder / "model.safetensors", metadata={"format": "pt"})
    write_json_atomic(folder / "config.json", config)
    return folder

