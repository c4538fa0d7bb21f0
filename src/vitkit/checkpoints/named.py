"""Weights asked for under a model name: the name's config says what the keys cannot.

A state dict shows the shapes and which parts a model has (register tokens, layer scale, a norm
before the blocks, attention pooling, ...), never its GELU flavour, LayerNorm epsilon or how its
position table is resized. ``vitkit.create_model(NAME, weights=FILE)`` therefore builds the model the
weights describe with the name's values of those fields; when the weights and the name disagree on
a part, on a value the source does store, or on the architecture (width, depth, MLP size, patch; sizes
given beside the name count as the name's, as timm's ``create_model(name, depth=2)``), the error names both.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from ..config import ConfigError, ViTConfig, check_fields, config_from_name, parse_model_name
from .base import Checkpoint

# the architecture: the weights and the name (with the sizes given beside it) must agree
ARCH_FIELDS = ("width", "depth", "mlp_dim", "patch_size", "backbone", "backbone_layers", "backbone_width")
# sizes otherwise come from the weights (resolution and head are adapted; heads come from the name)
SIZE_FIELDS = ("width", "depth", "mlp_dim", "patch_size", "in_chans", "img_size", "num_classes",
               "backbone_layers", "backbone_width", "num_heads")
# what the keys show: the weights and the name must agree
PART_FIELDS = ("class_token", "distill_token", "reg_tokens", "pool", "norm_pre", "final_norm", "patch_bias",
               "qkv_bias", "representation_size", "posemb", "backbone")
# the parts every name implies (by default: the paper's), compared whether the name states them or not
STRUCTURE = ("class_token", "distill_token", "reg_tokens", "pool", "norm_pre", "final_norm", "patch_bias")
# what no weights file stores: always the name's (the class-token slot is folded or added exactly)
NAME_FIELDS = ("posemb_class_slot", "posemb_resize", "posemb_antialias", "crop_remainder")
# how the readers' notes on assumed fields begin (dropped once the name has supplied the fields)
ASSUMED_NOTES = ("num_heads=", "a LayerNorm before the blocks", "no config.json")


def architecture(cfg: ViTConfig) -> str:
    """The shape of a model in words: width, depth, MLP size, patch (and a hybrid's ResNet)."""
    ph, pw = cfg.patch_size
    out = f"width {cfg.width}, depth {cfg.depth}, MLP {cfg.mlp_dim}, patch {ph}x{pw}"
    if cfg.backbone:
        out += f", {cfg.backbone} stages {list(cfg.backbone_layers)} of width {cfg.backbone_width}"
    return out


def check_architecture(have: ViTConfig, want: ViTConfig, weights: str, model: str) -> None:
    """ConfigError naming both shapes when the weights ``have`` are not the architecture ``want``."""
    if any(getattr(have, k) != getattr(want, k) for k in ARCH_FIELDS):
        raise ConfigError(f"{weights} are {architecture(have)}, but {model} is {architecture(want)}: pass the "
                          f"weights without a model name (the architecture is read from them), under the name of "
                          f"their model, or with the sizes that differ (e.g. depth=, width=)")


def name_config(name: str, given: Optional[Mapping[str, Any]] = None) -> ViTConfig:
    """What ``name`` means with the config fields ``given`` beside it applied (as timm's
    ``create_model(name, **kwargs)``)."""
    return config_from_name(name, **dict(given or {}))


def name_fields(name: str, ckpt: Checkpoint, given: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The config fields ``name`` gives the weights ``ckpt`` (to pass on to :func:`~.load.build`);
    ConfigError when they disagree, or when the architecture of the name with the fields ``given``
    beside it differs. ``num_heads`` is taken from the name where the weights do not show it; a field
    ``given`` is the caller's (it wins over the name's)."""
    given = dict(given or {})
    asked = parse_model_name(name)
    label = asked.pop("name", name)
    asked = {k: v for k, v in check_fields(asked).items() if k not in given}
    full = name_config(name, given)  # what the name means, defaults included: it fills what the reader assumed
    have = ckpt.config
    check_architecture(have, full, f"{ckpt.source or 'the weights'} ({ckpt.format} layout)", repr(label))
    out: Dict[str, Any] = {k: getattr(full, k) for k in ckpt.assumed}
    clashes = []
    for key, want in asked.items():
        got = getattr(have, key)
        if key in SIZE_FIELDS or key in ckpt.assumed:
            continue
        if key == "layer_scale":  # the weights show whether there is a scale, not its initial value
            if (want is None) != (got is None):
                clashes.append((key, got, want))
            elif want is not None:
                out[key] = want
        elif key in PART_FIELDS:
            if want != got and key not in STRUCTURE:
                clashes.append((key, got, want))
        elif key in NAME_FIELDS or key in ckpt.assumed or want == got:
            out[key] = want
        else:
            clashes.append((key, got, want))
    for key in STRUCTURE:  # the parts the name's model has, stated or by default
        if getattr(full, key) != getattr(have, key):
            clashes.append((key, getattr(have, key), getattr(full, key)))
    if clashes:
        theirs = ", ".join(f"{k}={g!r}" for k, g, _ in clashes)
        ours = ", ".join(f"{k}={w!r}" for k, _, w in clashes)
        raise ConfigError(f"{ckpt.source or 'the weights'} ({ckpt.format} layout) have {theirs}, but the model "
                          f"{label!r} has {ours}: pass the weights under the name of their model, or without a "
                          f"name (vitkit.load_weights) to build what the weights describe")
    if "img_size" not in given and full.grid_size == have.grid_size and full.img_size != have.img_size:
        out["img_size"] = full.img_size  # the same patches at the name's resolution (384 px as 27 x 14 px + 6)
    if ckpt.assumed:  # the readers' notes on what they assumed no longer apply
        ckpt.notes = [n for n in ckpt.notes if not n.startswith(ASSUMED_NOTES)]
        ckpt.notes.append(f"from the model name {label!r}: " + ", ".join(f"{k}={out[k]!r}" for k in ckpt.assumed))
    out["name"] = label
    return out
