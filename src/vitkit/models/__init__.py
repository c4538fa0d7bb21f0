"""Models: the Vision Transformer and its parts. Imports nothing from the rest of vitkit but config."""
from __future__ import annotations

from ..config import ViTConfig, list_models, register_model
from .adapt import adapt_state_dict
from .layers import Attention, Block, Mlp, PatchEmbed
from .posemb import RelativePositionBias, resize_pos_embed, sincos_2d
from .vit import VisionTransformer

__all__ = [
    "Attention", "Block", "Mlp", "PatchEmbed", "RelativePositionBias", "ViTConfig", "VisionTransformer",
    "adapt_state_dict", "list_models", "register_model", "resize_pos_embed", "sincos_2d",
]
