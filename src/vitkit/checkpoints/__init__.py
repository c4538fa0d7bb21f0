"""Checkpoints from every ecosystem, in and out.

- :func:`load_weights` (path in any format, or a known name) -> model adapted to the resolution /
  classes you ask for; ``return_state=True`` gives ``(state_dict, config)``.
- :func:`read_checkpoint` -> :class:`Checkpoint` (vitkit-layout weights, config, labels, preprocessing).
- :func:`save_weights` / :func:`convert`: write vitkit, npz, torchvision, timm or hf; A -> B -> A is exact.
- :data:`KNOWN` / :func:`list_known`: published checkpoints with their metadata.
- :func:`save_model` / :func:`load_model`: vitkit's own folder format.
"""
from .base import Checkpoint
from .load import TARGETS, build, checkpoint_of, convert, load_weights, read_checkpoint, save_weights
from .native import load_model, save_model
from .registry import KNOWN, KnownCheckpoint, get_known, list_known

__all__ = ["KNOWN", "TARGETS", "Checkpoint", "KnownCheckpoint", "build", "checkpoint_of", "convert", "get_known",
           "list_known", "load_model", "load_weights", "read_checkpoint", "save_model", "save_weights"]
