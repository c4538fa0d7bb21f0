"""The one check every checkpoint passes after it is read, whatever its format.

A reader turns a file into vitkit-layout tensors and the config they imply; :func:`validate_checkpoint`
then holds the tensors against that config before anything uses them: every key the model has, no other
key, each of the model's shape and a floating-point dtype. So a file with one tensor of the wrong shape
is refused when it is read, by every command (convert to any target, inspect, predict, eval, export,
train's init and teacher), instead of being written out and failing later. Non-finite values (NaN/Inf)
load, with a warning and a note, since a diverged model is still worth inspecting; ``predict``
refuses the non-finite outputs they cause.
"""
from __future__ import annotations

import warnings
from typing import Dict, List

import torch

from ..errors import CheckpointError, VitkitWarning
from ..models import VisionTransformer
from ..models.adapt import compare_state_dict
from .base import Checkpoint
from .keymap import show_keys

SHOW = 6


def expected_state(config) -> Dict[str, torch.Tensor]:
    """The model's own state dict for ``config``, shapes and dtypes only (built on the meta device: no
    memory, no initialisation)."""
    with torch.device("meta"):
        return VisionTransformer(config).state_dict()


def validate_checkpoint(ckpt: Checkpoint) -> Checkpoint:
    """Raise CheckpointError if the tensors do not fit the config; warn (and note) on non-finite values."""
    source = ckpt.source or "weights"
    expected = expected_state(ckpt.config)
    report = compare_state_dict(ckpt.state, expected)
    problems = [f"{what} {show_keys(keys, SHOW)}" for what, keys in (
        ("wrong shape (file vs config):", report["mismatched"]), ("missing:", report["missing"]),
        ("not part of the model:", report["unexpected"])) if keys]
    wrong_dtype = [f"{k} ({_dtype(v)})" for k, v in ckpt.state.items()
                   if k in expected and expected[k].is_floating_point() and not _is_float(v)]
    if wrong_dtype:
        problems.append(f"not floating point: {show_keys(wrong_dtype, SHOW)}")
    if problems:
        raise CheckpointError(f"the tensors do not fit the {ckpt.format} checkpoint's own config "
                              f"({ckpt.describe()}): " + "; ".join(problems), path=source,
                              hint="the file is corrupt or was edited; get a fresh copy")
    bad = non_finite(ckpt.state)
    if bad:
        note = (f"non-finite weights (NaN or Inf) in {len(bad)} tensor(s): {show_keys(bad, SHOW)}; the model's "
                f"outputs will not be meaningful (a diverged training run?)")
        ckpt.notes.append(note)
        warnings.warn(f"{source}: {note}", VitkitWarning, stacklevel=2)
    return ckpt


def non_finite(state: Dict[str, torch.Tensor]) -> List[str]:
    """Names of the floating-point tensors that hold a NaN or an infinity."""
    return [k for k, v in state.items() if _is_float(v) and not bool(torch.isfinite(torch.as_tensor(v)).all())]


def _is_float(v) -> bool:
    return torch.as_tensor(v).is_floating_point() if not isinstance(v, torch.Tensor) else v.is_floating_point()


def _dtype(v) -> str:
    return str(getattr(v, "dtype", type(v).__name__)).replace("torch.", "")
