"""vitkit's own checkpoint format: a folder with ``model.safetensors`` and ``vitkit.json``.

``vitkit.json`` holds the model config, and optionally the preprocessing and
the class labels, so a saved model reloads with one call and classifies
images the way it was trained. Loading never executes code from the files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from safetensors.torch import save_file

from ..config import ViTConfig
from ..errors import CheckpointError, ConfigError, InputError, NotFoundError
from ..models import VisionTransformer
from ..utils import PathLike, atomic_path, write_json_atomic
from .files import read_safetensors

FORMAT = "vitkit"
VERSION = 1
WEIGHTS = "model.safetensors"
META = "vitkit.json"


def save_model(model: VisionTransformer, path: PathLike, *, labels: Optional[List[str]] = None,
               preprocessing: Optional[Dict[str, Any]] = None, extra: Optional[Dict[str, Any]] = None) -> Path:
    """Write ``model`` to the folder ``path`` (created if needed); files are replaced atomically.
    ``labels`` and ``preprocessing`` default to the model's own (``model.meta``)."""
    folder = Path(path)
    labels = labels if labels is not None else model.meta.labels
    preprocessing = preprocessing if preprocessing is not None else model.meta.preprocessing
    folder.mkdir(parents=True, exist_ok=True)
    if labels is not None and model.config.num_classes and len(labels) != model.config.num_classes:
        raise InputError(f"{len(labels)} labels given for a {model.config.num_classes}-class model")
    if preprocessing is not None and hasattr(preprocessing, "to_dict"):
        preprocessing = preprocessing.to_dict()
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(folder / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", "producer": FORMAT})
    meta = {"format": FORMAT, "version": VERSION, "config": model.config.to_dict(),
            "labels": list(labels) if labels is not None else None, "preprocessing": preprocessing,
            "extra": extra or {}}
    write_json_atomic(folder / META, meta)
    return folder


def is_native(path: PathLike) -> bool:
    """A vitkit folder (or a file in one): it has a ``vitkit.json`` that says so, or one that cannot be
    parsed (vitkit's file, damaged: :func:`read_meta` then reports the JSON error and its line)."""
    p = Path(path)
    meta = p / META if p.is_dir() else p.with_name(META)
    if not meta.is_file():
        return False
    try:
        d = json.loads(meta.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True
    except OSError:
        return False
    return isinstance(d, dict) and d.get("format") == FORMAT


def read_meta(path: PathLike) -> Dict[str, Any]:
    p = Path(path)
    meta = p / META if p.is_dir() else p.with_name(META)
    try:
        d = json.loads(meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"not found: a vitkit checkpoint is a folder with {WEIGHTS} and {META}",
                            path=meta) from None
    except json.JSONDecodeError as err:  # its message names the line and column
        raise CheckpointError(f"not valid JSON ({err})", path=meta, hint="the checkpoint's description is damaged: "
                              "restore it or save the model again") from None
    except UnicodeDecodeError as err:
        raise CheckpointError(f"not UTF-8 text ({err})", path=meta,
                              hint="the checkpoint's description is damaged") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise CheckpointError(f"not a vitkit checkpoint description (format="
                              f"{d.get('format') if isinstance(d, dict) else None!r})", path=meta)
    try:
        version = int(d.get("version", 0))
    except (TypeError, ValueError):
        raise CheckpointError(f"version {d.get('version')!r} is not a number", path=meta) from None
    if version > VERSION:
        raise CheckpointError(f"format version {version}; this vitkit reads up to {VERSION}", path=meta,
                              hint="upgrade vitkit")
    if not isinstance(d.get("config"), dict):
        raise CheckpointError("has no 'config' mapping", path=meta, hint="the checkpoint's description is damaged")
    labels = d.get("labels")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise CheckpointError("'labels' must be a list of class names or null", path=meta,
                              hint="the checkpoint's description is damaged")
    if d.get("preprocessing") is not None and not isinstance(d["preprocessing"], dict):
        raise CheckpointError("'preprocessing' must be a mapping or null", path=meta,
                              hint="the checkpoint's description is damaged")
    return d


def read_native(path: PathLike):
    """The folder as a :class:`~vitkit.checkpoints.base.Checkpoint` (weights, config, labels, preprocessing)."""
    from .base import Checkpoint

    p = Path(path)
    folder = p if p.is_dir() else p.parent
    meta = read_meta(folder)
    try:
        config = ViTConfig.from_dict(meta["config"])
    except ConfigError as err:
        raise CheckpointError(f"its config is not valid ({err})", path=folder / META) from None
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise NotFoundError(f"not found next to {META}", path=weights)
    state = read_safetensors(weights)[0]
    extra = meta.get("extra") or {}
    return Checkpoint(state, config, FORMAT, labels=meta.get("labels"), preprocessing=meta.get("preprocessing"),
                      layout=dict(extra.get("source_layout") or {}), source=str(folder))
