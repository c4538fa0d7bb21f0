"""Checkpoints: vitkit's own format and (see the per-format modules) every foreign layout."""
from .native import load_model, save_model

__all__ = ["load_model", "save_model"]
