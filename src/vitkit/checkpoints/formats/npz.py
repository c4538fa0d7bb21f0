"""The authors' JAX ``.npz`` checkpoints: the paper's ``vision_transformer`` layout and big_vision's.

vision_transformer (``ViT-B_16.npz``, the AugReg files)::

    embedding/kernel [ph, pw, C, D]   cls [1, 1, D]   Transformer/posembed_input/pos_embedding [1, T, D]
    Transformer/encoderblock_{i}/LayerNorm_0, MultiHeadDotProductAttention_1/{query,key,value}/kernel [D, H, d]
    .../out/kernel [H, d, D], LayerNorm_2, MlpBlock_3/Dense_0|Dense_1, Transformer/encoder_norm,
    pre_logits (optional), head

big_vision: ``LayerNorm_0/1``, ``MultiHeadDotProductAttention_0``, ``MlpBlock_0``, the table at
the top (``pos_embedding``, no class slot: the class token gets no position),
optionally under an ``opt/target/`` or ``params/`` prefix.

Both use Flax's LayerNorm (eps 1e-6) and ``nn.gelu``, whose default is the tanh
approximation (``jax.nn.gelu(approximate=True)``): models read from .npz get
``gelu="tanh"``. Kernels are stored [in, out] (transposed); q/k/v per head.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ...errors import CheckpointError, ConfigError
from ..base import (
    Checkpoint,
    add_class_slot,
    descendant_parts,
    drop_class_slot,
    infer_config,
    layout_for,
    with_class_slots,
)
from ..files import write_npz
from ..keymap import (
    ATTN_OUT,
    CONV_HWIO,
    DENSE,
    QKV_HEADS,
    QKV_HEADS_BIAS,
    Context,
    Mapped,
    Rule,
    check_mapped,
    count_blocks,
    from_vitkit,
    rule,
    to_vitkit,
)
from . import hybrid

NAME = "npz"
FLAVOURS = {
    # flavour: (first LayerNorm, attention, second LayerNorm, MLP)
    "vit_jax": ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"),
    "big_vision": ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"),
}
POSEMB_KEYS = ("Transformer/posembed_input/pos_embedding", "pos_embedding", "Transformer/pos_embedding")
DEFAULT_POSEMB = {"vit_jax": POSEMB_KEYS[0], "big_vision": POSEMB_KEYS[1]}
PREFIXES = ("opt/target/", "params/", "")


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    layout = layout or {}
    flavour = layout.get("flavour", "vit_jax")
    ln1, att, ln2, mlp = FLAVOURS[flavour]
    pos_key = layout.get("posemb_key", DEFAULT_POSEMB[flavour])
    others = [k for k in POSEMB_KEYS if k != pos_key]
    b = "Transformer/encoderblock_{i}/"
    out = [
        rule("patch_embed.proj.weight", "embedding/kernel", CONV_HWIO),
        rule("patch_embed.proj.bias", "embedding/bias"),
        rule("cls_token", "cls", optional=True),
        rule("pos_embed", pos_key, aliases=others, optional=True),
        rule("blocks.{i}.norm1.weight", b + ln1 + "/scale"), rule("blocks.{i}.norm1.bias", b + ln1 + "/bias"),
        rule("blocks.{i}.attn.qkv.weight", [f"{b}{att}/{n}/kernel" for n in ("query", "key", "value")], QKV_HEADS),
        rule("blocks.{i}.attn.qkv.bias", [f"{b}{att}/{n}/bias" for n in ("query", "key", "value")], QKV_HEADS_BIAS,
             optional=True),
        rule("blocks.{i}.attn.proj.weight", f"{b}{att}/out/kernel", ATTN_OUT),
        rule("blocks.{i}.attn.proj.bias", f"{b}{att}/out/bias"),
        rule("blocks.{i}.norm2.weight", b + ln2 + "/scale"), rule("blocks.{i}.norm2.bias", b + ln2 + "/bias"),
        rule("blocks.{i}.mlp.fc1.weight", f"{b}{mlp}/Dense_0/kernel", DENSE),
        rule("blocks.{i}.mlp.fc1.bias", f"{b}{mlp}/Dense_0/bias"),
        rule("blocks.{i}.mlp.fc2.weight", f"{b}{mlp}/Dense_1/kernel", DENSE),
        rule("blocks.{i}.mlp.fc2.bias", f"{b}{mlp}/Dense_1/bias"),
        rule("norm.weight", "Transformer/encoder_norm/scale"), rule("norm.bias", "Transformer/encoder_norm/bias"),
        rule("pre_logits.fc.weight", "pre_logits/kernel", DENSE, optional=True),
        rule("pre_logits.fc.bias", "pre_logits/bias", optional=True),
        rule("head.weight", "head/kernel", DENSE, optional=True),
        rule("head.bias", "head/bias", optional=True),
    ]
    return out


def find_prefix(keys) -> str:
    for prefix in PREFIXES:
        if prefix + "embedding/kernel" in keys:
            return prefix
    cands = sorted((k[: -len("embedding/kernel")] for k in keys if k.endswith("/embedding/kernel")), key=len)
    return cands[0] if cands else ""


def find_flavour(keys) -> str:
    if any("MultiHeadDotProductAttention_1/" in k for k in keys):
        return "vit_jax"
    if any("MultiHeadDotProductAttention_0/" in k for k in keys):
        return "big_vision"
    return "vit_jax"


def read(arrays: Dict[str, Any], *, num_heads: Optional[int] = None, source: str = "") -> Checkpoint:
    keys = list(arrays)
    prefix = find_prefix(keys)
    ignored = [k for k in keys if not k.startswith(prefix)]
    params = {k[len(prefix):]: _tensor(v) for k, v in arrays.items() if k.startswith(prefix)}
    flavour = find_flavour(params)
    pos_key = next((k for k in POSEMB_KEYS if k in params), DEFAULT_POSEMB[flavour])
    layout = {"flavour": flavour, "prefix": prefix, "posemb_key": pos_key}
    q = params.get(f"Transformer/encoderblock_0/{FLAVOURS[flavour][1]}/query/kernel")
    heads = num_heads or (int(q.shape[1]) if q is not None and q.ndim == 3 else None)
    width = int(q.shape[0]) if q is not None else 1
    depth = count_blocks(params, "Transformer/encoderblock_{i}/" + FLAVOURS[flavour][0] + "/scale")
    extra, numerics = hybrid.read_rules(params, NAME)  # a hybrid's ResNet, if any
    mapped = to_vitkit(params, rules(layout) + extra, depth, Context(width, heads or 1))
    check_mapped(mapped, source, NAME)
    state = mapped.state
    if "pos_embed" in state and state["pos_embed"].ndim == 2:
        state["pos_embed"] = state["pos_embed"][None]
    layout["posemb_class_slot"] = not add_class_slot(state)
    notes = [f"ignored {len(ignored)} arrays outside '{prefix}' (optimizer state)"] if ignored else []
    cfg = infer_config(state, num_heads=heads, ln_eps=1e-6, gelu="tanh", **numerics)
    from ...data.preprocess import get_preset
    return Checkpoint(state, cfg, NAME, preprocessing=get_preset("authors", cfg.img_size).to_dict(),
                      layout=layout, source=source, notes=notes)


def _tensor(a: Any) -> torch.Tensor:
    arr = np.asarray(a)
    if arr.dtype.kind not in "fiub":
        raise CheckpointError(f"an .npz array has dtype {arr.dtype}: weights are numbers")
    return torch.from_numpy(np.ascontiguousarray(arr))


def write(ckpt: Checkpoint, dst: Path, *, flavour: Optional[str] = None, prefix: Optional[str] = None, **_) -> Path:
    cfg = ckpt.config
    if cfg.posemb not in ("learn", "none") or cfg.posemb_where != "input":
        raise CheckpointError(f"the .npz layouts hold a learned 1D position table at the input; this model has "
                              f"posemb={cfg.posemb}, posemb_where={cfg.posemb_where}: use --to vitkit")
    if cfg.distill_token:
        raise CheckpointError("the .npz layouts have no distillation token (DeiT): write this model as vitkit, timm "
                              "or hf")
    if descendant_parts(cfg):
        raise CheckpointError(f"the .npz layouts hold the paper's ViT; this model has "
                              f"{', '.join(descendant_parts(cfg))}: write it as vitkit or timm")
    layout = layout_for(ckpt, NAME)
    if flavour:
        if flavour not in FLAVOURS:
            raise ConfigError(f"npz flavour {flavour!r}: use {' or '.join(FLAVOURS)}")
        if flavour != layout.get("flavour"):
            layout = {"flavour": flavour}
    layout.setdefault("flavour", "vit_jax")
    if prefix is not None:
        layout["prefix"] = prefix
    state = ckpt.state
    class_slot = layout.get("posemb_class_slot", layout["flavour"] == "vit_jax" or not cfg.class_token)
    if class_slot:
        state = with_class_slots(state, cfg)
    elif cfg.posemb_class_slot:
        state = drop_class_slot(state)
    mapped: Mapped = from_vitkit(state, rules(layout) + hybrid.write_rules(cfg, NAME), cfg.depth,
                                 Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"the .npz layout has no place for {mapped.unused}")
    pre = layout.get("prefix", "")
    arrays = {pre + k: (v.float() if v.dtype == torch.bfloat16 else v).detach().cpu().contiguous().numpy()
              for k, v in mapped.state.items()}
    return write_npz(arrays, dst)
