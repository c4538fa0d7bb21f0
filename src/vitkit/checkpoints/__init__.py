"""Checkpoints from every ecosystem, in and out.

- :func:`load_weights` (path in any format, a known name, a Hub id or a URL; fetched into the standard
  caches when needed) -> model adapted to the resolution / classes you ask for, its labels,
  preprocessing and origin in ``model.meta``; ``return_state=True`` gives ``(state_dict, config)``.
- :func:`resolve_weights`: the local file for a name (downloads; :func:`download_url` for one URL).
- :func:`read_checkpoint` -> :class:`Checkpoint` (vitkit-layout weights, config, labels, preprocessing).
- :func:`save_weights` / :func:`convert`: write vitkit, npz, torchvision, timm or hf; A -> B -> A is exact.
- :data:`KNOWN` / :func:`list_known`: published checkpoints with their metadata.
- :func:`push_to_hub`: a Hugging Face Hub repository in timm's or transformers' folder layout.
- :func:`save_model`: vitkit's own folder format (read back by :func:`load_weights`, or its
  shorthand :func:`load_model`).
"""
from .base import Checkpoint
from .download import WeightsUnavailable, download_url
from .load import (
                   TARGETS,
                   build,
                   checkpoint_of,
                   convert,
                   load_model,
                   load_weights,
                   read_checkpoint,
                   read_weights,
                   save_weights,
)
from .native import save_model
from .push import push_to_hub
from .registry import KNOWN, KnownCheckpoint, get_known, list_known
from .sources import resolve_weights

__all__ = ["KNOWN", "TARGETS", "Checkpoint", "KnownCheckpoint", "WeightsUnavailable", "build", "checkpoint_of",
           "convert", "download_url", "get_known", "list_known", "load_model", "load_weights", "push_to_hub",
           "read_checkpoint", "read_weights", "resolve_weights", "save_model", "save_weights"]
