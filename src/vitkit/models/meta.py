"""What a model's weights came with: class names, preprocessing and origin (one declared field).

Every :class:`~vitkit.models.vit.VisionTransformer` carries a :class:`ModelMeta` as
``model.meta`` (in the spirit of timm's ``pretrained_cfg`` and Hugging Face's
``config.id2label``). A freshly built model has an empty one; the checkpoint
loader fills it; saving writes it back out. Nothing reads it with ``getattr``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# The paper authors' evaluation pipeline (vit_jax): squash to the model size with TF-style bilinear resizing,
# then (x - 127.5) / 127.5. The one definition: vitkit.data.preprocess's "authors" preset is built from it, and
# a model whose weights brought no preprocessing reports it as its default (``pretrained_cfg``).
AUTHORS_PREPROCESSING: Dict[str, Any] = {
    "name": "authors", "size": (224, 224), "resize": None, "resize_mode": "squash", "interpolation": "bilinear",
    "backend": "tensor", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
    "description": "the paper's code (vit_jax, TF-style resize)"}


@dataclass
class ModelMeta:
    labels: Optional[List[str]] = None  # class names, index -> name
    preprocessing: Optional[Dict[str, Any]] = None  # a vitkit.data.preprocess.Preset as a dict
    format: Optional[str] = None  # the checkpoint format read: vitkit | npz | torchvision | timm | hf
    source: Optional[str] = None  # where the weights came from: a path, URL, Hub id or known name
    layout: Dict[str, Any] = field(default_factory=dict)  # how the source spelled its keys (for writing back)
    notes: List[str] = field(default_factory=list)  # the adaptations made while loading

    def to_dict(self) -> Dict[str, Any]:
        """The fields as plain JSON values."""
        return {"labels": self.labels, "preprocessing": self.preprocessing, "format": self.format,
                "source": self.source, "layout": dict(self.layout), "notes": list(self.notes)}
