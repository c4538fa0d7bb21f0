"""vitkit's own checkpoint format: a folder with ``model.safetensors`` and ``vitkit.json``.

``vitkit.json`` holds the model config, and optionally the preprocessing and
the class labels, so a saved model reloads with one call and classifies
images the way it was trained. Loading never executes code from the files.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from safetensors.torch import load_file, save_file

from ..config import ViTConfig
from ..models import VisionTransformer
from ..utils import PathLike, atomic_path, write_json_atomic

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
        raise ValueError(f"{len(labels)} labels given for a {model.config.num_classes}-class model")
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
    p = Path(path)
    meta = p / META if p.is_dir() else p.with_name(META)
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("format") == FORMAT
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return False


def read_meta(path: PathLike) -> Dict[str, Any]:
    p = Path(path)
    meta = p / META if p.is_dir() else p.with_name(META)
    try:
        d = json.loads(meta.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{meta} not found: a vitkit checkpoint is a folder with {WEIGHTS} and {META}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{meta} is not valid JSON ({err}): the checkpoint is corrupt") from None
    if d.get("format") != FORMAT:
        raise ValueError(f"{meta} is not a vitkit checkpoint description (format={d.get('format')!r})")
    if int(d.get("version", 0)) > VERSION:
        raise ValueError(f"{meta} has format version {d['version']}; this vitkit reads up to {VERSION}: upgrade vitkit")
    return d


def read_native(path: PathLike):
    """The folder as a :class:`~vitkit.checkpoints.base.Checkpoint` (weights, config, labels, preprocessing)."""
    from .base import Checkpoint

    p = Path(path)
    folder = p if p.is_dir() else p.parent
    meta = read_meta(folder)
    config = ViTConfig.from_dict(meta["config"])
    weights = folder / WEIGHTS
    try:
        state = load_file(str(weights))
    except FileNotFoundError:
        raise FileNotFoundError(f"{weights} not found next to {META}") from None
    except Exception as err:
        raise ValueError(f"{weights} could not be read ({err}): the file is truncated or corrupt") from None
    extra = meta.get("extra") or {}
    return Checkpoint(state, config, FORMAT, labels=meta.get("labels"), preprocessing=meta.get("preprocessing"),
                      layout=dict(extra.get("source_layout") or {}), source=str(folder))
