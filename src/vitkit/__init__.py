"""vitkit: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), all of it, in PyTorch."""
from __future__ import annotations

from .api import create_model
from .checkpoints import WeightsUnavailable, convert, load_weights, read_checkpoint, save_weights
from .config import ConfigError, ViTConfig, list_models, parse_model_name, register_model
from .data.preprocess import get_preset
from .models import VisionTransformer, adapt_state_dict, resize_pos_embed
from .models.cost import cost
from .models.kernel_plan import Backend, KernelPlan, set_backend, use_backend
from .models.meta import ModelMeta
from .predict import classify, create_transform
from .version import __version__

__all__ = [
    "Backend", "ConfigError", "KernelPlan", "ModelMeta", "ViTConfig", "VisionTransformer", "WeightsUnavailable",
    "adapt_state_dict",
    "classify", "cost", "create_model", "create_transform", "list_models", "parse_model_name", "register_model",
    "resize_pos_embed", "__version__", "convert", "get_preset", "load_weights", "read_checkpoint", "save_weights",
    "set_backend", "use_backend",
]
