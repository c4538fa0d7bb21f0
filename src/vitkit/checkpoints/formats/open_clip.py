"""OpenCLIP's image tower (``open_clip.VisionTransformer``): a CLIP model's state dict (its ``visual.`` keys;
the text tower is dropped with a note) or the tower's own (``model.visual.state_dict()``).

Keys: ``conv1`` (no bias), ``class_embedding`` [D] and ``positional_embedding`` [tokens, D] without the
batch axis, ``ln_pre``, ``transformer.resblocks.{i}.{ln_1, attn.in_proj_weight|bias, attn.out_proj, ln_2,
mlp.c_fc, mlp.c_proj, ls_1/ls_2.gamma}``, ``ln_post`` (on every token before pooling) and ``proj``
[D, P], the projection ``x @ proj``: vitkit's head with a zero bias. The keys do not say the activation:
OpenAI's weights (and ``-quickgelu`` models) use QuickGELU, the others exact GELU; exact is assumed, a
model name gives it (``create_model("openai/clip-vit-base-patch16", weights=FILE)``). LayerNorm eps is
torch's default, 1e-5. Written as the tower's state dict, which ``model.visual.load_state_dict`` loads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from ...errors import CheckpointError
from ..base import Checkpoint, heads_note, infer_config, with_class_slots
from ..files import write_safetensors, write_torch
from ..keymap import DENSE, UNBATCHED, Context, Rule, check_mapped, count_blocks, from_vitkit, linear, rule, to_vitkit

NAME = "open_clip"
R = "transformer.resblocks.{i}."
RULES: List[Rule] = [
    rule("patch_embed.proj.weight", "conv1.weight"),
    rule("cls_token", "class_embedding", UNBATCHED),
    rule("pos_embed", "positional_embedding", UNBATCHED),
    *linear("norm_pre", "ln_pre"),
    *linear("blocks.{i}.norm1", R + "ln_1"),
    *linear("blocks.{i}.attn.qkv", R + "attn", weight="in_proj_weight", bias="in_proj_bias"),
    *linear("blocks.{i}.attn.proj", R + "attn.out_proj"),
    rule("blocks.{i}.ls1.gamma", R + "ls_1.gamma", optional=True),
    *linear("blocks.{i}.norm2", R + "ln_2"),
    *linear("blocks.{i}.mlp.fc1", R + "mlp.c_fc"),
    *linear("blocks.{i}.mlp.fc2", R + "mlp.c_proj"),
    rule("blocks.{i}.ls2.gamma", R + "ls_2.gamma", optional=True),
    *linear("norm", "ln_post"),
    rule("head.weight", "proj", DENSE, optional=True),  # x @ proj: a head [P, D] without bias
]
DEPTH_KEY = R + "ln_1.weight"


def rules(layout: Optional[Dict[str, Any]] = None) -> List[Rule]:
    return RULES


def tower(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """The image tower's keys: a CLIP model's ``visual.`` ones (prefix removed), else all."""
    if any(k.startswith("visual.") for k in tensors):
        return {k[len("visual."):]: v for k, v in tensors.items() if k.startswith("visual.")}
    return dict(tensors)


def signature_hits(keys) -> int:
    """How many keys the table takes (format detection); 0 without the tower's own class embedding or
    residual blocks (a ResNet's ``conv1`` alone is not OpenCLIP's)."""
    from ..keymap import signature_hits as hits
    visual = [k for k in keys if k.startswith("visual.")]
    keys = [k[len("visual."):] for k in visual] if visual else list(keys)
    if "class_embedding" not in keys and not any(k.startswith("transformer.resblocks.") for k in keys):
        return 0
    return hits(keys, RULES)


def read(tensors: Dict[str, Any], *, num_heads: Optional[int] = None, source: str = "") -> Checkpoint:
    notes: List[str] = []
    visual = tower(tensors)
    if len(visual) < len(tensors):
        notes.append(f"the text tower ({len(tensors) - len(visual)} tensors) dropped: vitkit reads the image tower")
    mapped = to_vitkit(visual, RULES, count_blocks(visual, DEPTH_KEY), Context(1, 1))
    check_mapped(mapped, source, "OpenCLIP")
    state = mapped.state
    if "head.weight" in state:
        state["head.bias"] = state["head.weight"].new_zeros(state["head.weight"].shape[0])
    cfg = infer_config(state, num_heads=num_heads, ln_eps=1e-5, gelu="exact", posemb_resize="bicubic")
    notes.append("OpenCLIP's keys do not say the activation: exact GELU assumed (OpenAI's weights use QuickGELU: "
                 "load them under a QuickGELU model name, or pass gelu='quick')")
    if not num_heads:
        notes.append(heads_note(cfg))
    return Checkpoint(state, cfg, NAME, source=source, notes=notes, layout={"flavour": "open_clip"},
                      assumed=("gelu",) + (() if num_heads else ("num_heads",)))


def write(ckpt: Checkpoint, dst: Path, *, safetensors: bool = False) -> Path:
    """The tower's state dict (``.pth``, or ``.safetensors``), for ``model.visual.load_state_dict``."""
    cfg = ckpt.config
    problems = [what for what, bad in (
        ("a class-token read-out", not cfg.class_token or cfg.pool != "token"),
        ("a LayerNorm before the blocks and no patch bias", not cfg.norm_pre or cfg.patch_bias),
        ("the final LayerNorm on every token", cfg.final_norm != "tokens"),
        ("learned 1D position embeddings at the input", cfg.posemb != "learn" or cfg.posemb_where != "input"),
        ("no register or distillation tokens, pre-logits layer or hybrid stem",
         cfg.reg_tokens or cfg.distill_token or cfg.representation_size or cfg.backbone),
        ("q/k/v biases", not cfg.qkv_bias)) if bad]
    state = with_class_slots(dict(ckpt.state), cfg)
    if cfg.num_classes and bool(state.pop("head.bias").any()):
        problems.append("a head without bias (CLIP's projection)")
    if problems:
        raise CheckpointError(f"OpenCLIP's image tower needs {'; '.join(problems)}: this model cannot be written in "
                         f"its layout")
    mapped = from_vitkit(state, RULES, cfg.depth, Context(cfg.width, cfg.num_heads))
    if mapped.unused:
        raise CheckpointError(f"OpenCLIP's image tower has no place for {mapped.unused}")
    return write_safetensors(mapped.state, dst) if safetensors else write_torch(mapped.state, dst)
