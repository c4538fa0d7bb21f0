"""Models: the Vision Transformer and its parts. Imports nothing from the rest of vitkit but config."""
from __future__ import annotations

from typing import Any, Union

from ..config import ViTConfig, config_from_name, list_models, register_model
from .adapt import adapt_state_dict
from .layers import Attention, Block, Mlp, PatchEmbed
from .posemb import RelativePositionBias, resize_pos_embed, sincos_2d
from .vit import VisionTransformer


def create_model(name: Union[str, ViTConfig] = "B/16", **overrides: Any) -> VisionTransformer:
    """Build a randomly initialised model from a name (``B/16``, ``vit_base_patch16_224``,
    ``vit-b16``, a registered name) or a ViTConfig, with any config field overridden."""
    cfg = name.replace(**overrides) if isinstance(name, ViTConfig) else config_from_name(name, **overrides)
    return VisionTransformer(cfg)


__all__ = [
    "Attention", "Block", "Mlp", "PatchEmbed", "RelativePositionBias", "ViTConfig", "VisionTransformer",
    "adapt_state_dict", "create_model", "list_models", "register_model", "resize_pos_embed", "sincos_2d",
]
