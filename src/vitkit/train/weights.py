"""Starting weights for fine-tuning and models for evaluation, through the checkpoint loader.

Every format vitkit reads (its own folders, timm / torchvision / Hugging Face files, the authors' .npz)
goes through :mod:`vitkit.checkpoints`; the model is built at the recipe's configuration and the
weights are adapted there (position embeddings resized on the 2D grid, a zero-initialised head for a
new class count: Section 3.2 of the paper).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..config import ViTConfig
from ..models import VisionTransformer
from ..utils import PathLike

if TYPE_CHECKING:
    from .recipe import Recipe


def start_model(recipe: "Recipe", num_classes: int, in_chans: int) -> Tuple[VisionTransformer, List[str]]:
    """The ViT a run of ``recipe`` starts from, for ``num_classes`` classes of ``in_chans``-channel images: new
    at the recipe's configuration, or ``init.checkpoint``'s weights adapted to it (with the notes of what
    loading adapted)."""
    if recipe.init.checkpoint:
        chans = None if recipe.model.get("in_chans", "auto") == "auto" else in_chans  # auto: the checkpoint's
        return load_init(recipe.init.checkpoint, lambda base: recipe.model_config(num_classes, chans, base=base),
                         head=recipe.init.head, num_heads=recipe.init.num_heads)
    return VisionTransformer(recipe.model_config(num_classes=num_classes, in_chans=in_chans)), []


def load_init(path: PathLike, target: Callable[[ViTConfig], ViTConfig], *, head: str = "auto",
              num_heads: Optional[int] = None) -> Tuple[VisionTransformer, List[str]]:
    """Read ``path``, build ``VisionTransformer(target(checkpoint_config))`` and load the adapted weights.
    Returns the model (train mode) and the list of adaptations made."""
    from ..checkpoints import build, read_weights

    ckpt = read_weights(path, num_heads=num_heads)
    cfg = target(ckpt.config)
    model = VisionTransformer(cfg)
    model = build(ckpt, model=model, head=head, strict=True)
    notes = list(model.meta.notes)
    return model.train(), notes


def load_for_eval(path: PathLike) -> Tuple[VisionTransformer, Optional[List[str]], Optional[Dict[str, Any]]]:
    """(model in eval mode, its labels, its preprocessing record) from any checkpoint vitkit reads."""
    from ..checkpoints import load_weights

    model = load_weights(path)
    return model.eval(), model.meta.labels, model.meta.preprocessing
