"""The one-line entry points: a model by name with or without its published weights, and classification.

``create_model(name)`` builds a randomly initialised model (the one ``create_model``: ``vitkit.models`` has none);
``create_model(name, pretrained=True)`` loads the weights published for that name and
``create_model(name, weights=...)`` any weights :func:`vitkit.load_weights` reads (path, known name,
Hugging Face Hub id, URL), fetched into the standard caches on first use.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Optional, Union

from .aliases import from_timm
from .checkpoints import load_weights
from .checkpoints.load import build, read_weights
from .checkpoints.named import check_architecture
from .checkpoints.registry import KNOWN, KnownCheckpoint, get_known
from .config import ConfigError, ViTConfig, config_from_name
from .models import VisionTransformer
from .utils import PathLike

# which publisher a naming style points to when a name has several published checkpoints
_STYLE = ((re.compile(r"^vit_[blh]_\d+$", re.I), "torchvision"), (re.compile(r"^vit_\w+_patch\d+", re.I), "timm"),
          (re.compile(r"^(google|facebook)/", re.I), "hf"), (re.compile(r"^vit[-_ ]?[a-z]+[-_/]\d+$", re.I), "vit_jax"))


def create_model(name: Union[str, ViTConfig, None] = None, pretrained: bool = False, *,
                 weights: Optional[Union[str, PathLike]] = None, **overrides: Any) -> VisionTransformer:
    """A model by name (``B/16``, ``vit_base_patch16_224``, ``google/vit-base-patch16-224``, ...).

    - no ``weights``: a randomly initialised model (no name: ``B/16``).
    - ``pretrained=True``: with the weights published for that name (``vit_b_16`` -> torchvision's,
      ``vit_base_patch16_224`` -> timm's, a Hub id or known name -> itself; ``vitkit weights`` lists them).
    - ``weights=`` without a name: the model the weights describe, as :func:`vitkit.load_weights` builds it
      (architecture from the tensors; heads, where a file does not store them, from the standard size of
      its width; a width of no standard size raises, asking for ``num_heads=``: ``load_weights`` and
      ``vitkit convert`` read such weights with 64-dim heads, which is exact for the tensors but may not
      be the model that was trained).
    - ``weights=`` with a name: built with what the name says and the keys cannot (QuickGELU, LayerNorm
      epsilon, heads); a name whose architecture (width, depth, MLP, patch) or parts (register tokens,
      layer scale, ...) differ from the weights raises, naming both. Sizes given beside the name count as
      the name's, as in timm (``create_model("vit_base_patch16_224", weights=f, depth=2)``).
    - a :class:`ViTConfig` with ``weights=``: the weights loaded into that config (same architecture).
    - other keyword arguments are config fields (``num_classes=10`` with weights: a new zero head;
      ``img_size=384``: position embeddings resized; ``drop_path=0.1``, ...) or timm's names for them
      (``drop_path_rate``, ``global_pool``, ``init_values``, ``class_token``, ``num_classes=0`` for the pooled
      features, ...: :mod:`vitkit.aliases`).
    """
    overrides = from_timm(overrides, width=_width_of(name, overrides))
    if weights is None and pretrained:
        weights = default_weights("B/16" if name is None else name)
    if weights is None:  # random initialisation
        if isinstance(name, ViTConfig):
            return VisionTransformer(name.replace(**overrides))
        return VisionTransformer(config_from_name("B/16" if name is None else name, **overrides))
    if isinstance(name, ViTConfig):
        return _into_config(weights, name.replace(**overrides))
    model_name = name if _is_model_name(name) else None
    # built to compute with: without a name, heads come from the weights or the standard sizes, never a guess
    return load_weights(weights, model_name=model_name, standard_heads=model_name is None, **overrides)


def _into_config(weights: Union[str, PathLike], cfg: ViTConfig) -> VisionTransformer:
    """The weights loaded into a model of ``cfg``; ConfigError naming both shapes when they are another
    architecture (before the strict key check would list every key)."""
    ckpt = read_weights(weights, num_heads=cfg.num_heads)
    check_architecture(ckpt.config, cfg, f"{ckpt.source or 'the weights'} ({ckpt.format} layout)", "the config")
    return build(ckpt, model=VisionTransformer(cfg))


def _width_of(name: Union[str, ViTConfig, None], overrides: Dict[str, Any]) -> Optional[int]:
    """The width the name (or config) gives, for timm's ``mlp_ratio``; None without a name."""
    if isinstance(name, ViTConfig):
        return name.width
    if "mlp_ratio" not in overrides or not _is_model_name(name):
        return None
    return config_from_name(name).width


def _is_model_name(name: Union[str, ViTConfig, None]) -> bool:
    """A name vitkit parses into a config (not a Hub id or URL it only fetches)."""
    if not isinstance(name, str):
        return False
    try:
        config_from_name(name)
    except ConfigError:
        return False
    return True


def default_weights(name: Union[str, ViTConfig]) -> str:
    """The name of the published weights ``create_model(name, pretrained=True)`` loads."""
    if isinstance(name, str):
        if get_known(name) is not None:
            return get_known(name).name
        from .checkpoints.sources import as_repo, as_url
        if as_url(name) or (as_repo(name) and "/" in name and not name.startswith("hf-hub:")
                             and name.split("/")[0].lower() in ("google", "facebook")):
            return name  # a URL, or a Hub repository of a model name: itself
        if "." in name and as_repo(name):
            return name  # timm's name.tag: that tag's repository
        try:
            cfg = config_from_name(name)
        except ConfigError:
            if as_repo(name):
                return name  # hf-hub:org/name, org/name, timm's name.tag
            raise
    else:
        cfg = name
    fits = [e for e in KNOWN.values() if _same_model(e, cfg)]
    if not fits:
        other = sorted({f"{e.name} ({e.img_size} px)" for e in KNOWN.values() if e.model == cfg.name})
        raise ConfigError(f"no published weights for {name} at {cfg.img_size[0]} px"
                          + (f"; for {cfg.name}: {', '.join(other)}" if other else "")
                          + ": pass weights= (a file, Hub id or URL), or see 'vitkit weights'")
    style = next((src for rx, src in _STYLE if isinstance(name, str) and rx.match(name)), None)
    ranked = sorted(fits, key=lambda e: (e.source != style, e.num_classes != 1000))
    return ranked[0].name


def _same_model(e: KnownCheckpoint, cfg: ViTConfig) -> bool:
    try:
        known = config_from_name(e.model)
    except ConfigError:
        return False
    return (known.width, known.depth, known.patch_size, known.distill_token) == \
        (cfg.width, cfg.depth, cfg.patch_size, cfg.distill_token) and (e.img_size, e.img_size) == cfg.img_size \
        and all(getattr(known, k) == getattr(cfg, k) for k in _PARTS) and (known.layer_scale is None) == \
        (cfg.layer_scale is None)


# the parts and numerics by which a descendant's published weights differ from the paper's ViT
_PARTS = ("reg_tokens", "norm_pre", "pool", "final_norm", "gelu", "class_token", "patch_bias")


__all__ = ["create_model", "default_weights"]
