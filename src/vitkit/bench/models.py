"""Which models a benchmark runs: names, recipe models, and the contenders built from them."""
from __future__ import annotations

import copy
from typing import Any, Dict, Optional, Tuple

import torch

from ..config import ViTConfig, config_from_name
from ..models import VisionTransformer

RECIPE_PREFIX = "recipe:"


def model_config(spec: str, img_size: Optional[int] = None, overrides: Optional[Dict[str, Any]] = None
                 ) -> Tuple[str, ViTConfig]:
    """(label, config) for ``B/16``-style names or ``recipe:NAME`` (the model of a training recipe,
    with the channels and classes of its dataset: Fashion-MNIST is 1 channel, 10 classes)."""
    overrides = dict(overrides or {})
    if img_size is not None:
        overrides["img_size"] = img_size
    if spec.startswith(RECIPE_PREFIX):
        from ..train import load_recipe

        name = spec[len(RECIPE_PREFIX):]
        recipe = load_recipe(name)
        ds = (recipe.data.dataset or "").split(":")[0]
        chans, classes = {"fashion-mnist": (1, 10), "mnist": (1, 10), "cifar10": (3, 10),
                          "cifar100": (3, 100)}.get(ds, (None, None))
        cfg = recipe.model_config(num_classes=classes, in_chans=chans)
        return spec, cfg.replace(**overrides) if overrides else cfg
    cfg = config_from_name(spec, **overrides)
    return spec, cfg


def build_model(cfg: ViTConfig, seed: int = 0) -> VisionTransformer:
    """A randomly initialised model whose head is not zero (so logits carry information and peers'
    logits can be compared)."""
    torch.manual_seed(seed)
    model = VisionTransformer(cfg)
    if isinstance(model.head, torch.nn.Linear):
        with torch.no_grad():
            model.head.weight.normal_(std=0.02)
    return model.eval()


def clone(model: VisionTransformer) -> VisionTransformer:
    return copy.deepcopy(model)


def example_batch(cfg: ViTConfig, batch: int, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    """Normalised random images [batch, C, H, W] in fp32 (each contender casts to its own dtype)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.in_chans, *cfg.img_size, generator=g).to(device)
