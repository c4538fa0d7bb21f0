"""One small key-map module per foreign layout. Each has NAME, ``rules(layout)``, ``read`` and ``write``."""
from . import hf, npz, timm, torchvision

FORMATS = {m.NAME: m for m in (npz, torchvision, timm, hf)}

__all__ = ["FORMATS", "hf", "npz", "timm", "torchvision"]
