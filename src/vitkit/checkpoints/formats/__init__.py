"""One small key-map module per foreign layout. Each has NAME, ``rules(layout)``, ``read`` and ``write``."""
from . import hf, hf_towers, npz, open_clip, timm, torchvision

FORMATS = {m.NAME: m for m in (npz, torchvision, timm, hf, hf_towers, open_clip)}

__all__ = ["FORMATS", "hf", "hf_towers", "npz", "open_clip", "timm", "torchvision"]
