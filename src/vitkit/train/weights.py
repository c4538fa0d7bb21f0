"""Starting weights for fine-tuning and models for evaluation, through the checkpoint loader.

Every format vitkit reads (its own folders, timm / torchvision / Hugging Face files, the authors' .npz)
goes through :mod:`vitkit.checkpoints`; the model is built at the recipe's configuration and the
weights are adapted there (position embeddings resized on the 2D grid, a zero-initialised head for a
new class count: Section 3.2 of the paper).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ..config import section_config
from ..models import VisionTransformer
from ..utils import PathLike

if TYPE_CHECKING:
    from .recipe import Recipe


def start_model(recipe: "Recipe", num_classes: int, in_chans: int) -> Tuple[VisionTransformer, List[str]]:
    """The ViT a run of ``recipe`` starts from, for ``num_classes`` classes of ``in_chans``-channel images: new
    at the recipe's configuration, or ``init.checkpoint``'s weights adapted to it (position embeddings resized,
    a new head zero-initialised ...; with the notes of what loading adapted). The checkpoint, if any, is read
    first (by vitkit's loader: nothing in it is executed), then the configuration resolved once on top of it."""
    from ..checkpoints import build, read_weights

    init = recipe.init
    ckpt = read_weights(init.checkpoint, num_heads=init.num_heads) if init.checkpoint else None
    if ckpt is not None and recipe.model.get("in_chans", "auto") == "auto":
        in_chans = None  # auto: the checkpoint's
    config = section_config(recipe.model, num_classes, in_chans, base=ckpt.config if ckpt is not None else None)
    model = VisionTransformer(config)
    if ckpt is None:
        return model, []
    model = build(ckpt, model=model, head=init.head, strict=True)
    return model.train(), list(model.meta.notes)


def load_for_eval(path: PathLike) -> Tuple[VisionTransformer, Optional[List[str]], Optional[Dict[str, Any]]]:
    """(model in eval mode, its labels, its preprocessing record) from any checkpoint vitkit reads."""
    from ..checkpoints import load_weights

    model = load_weights(path)
    return model.eval(), model.meta.labels, model.meta.preprocessing
