"""Frozen features of a model for linear evaluation: batched extraction and an on-disk cache.

Representations (``REPRESENTATIONS``):

- ``pre_logits``: what the head sees, ``forward_head(tokens, pre_logits=True)``:
  the final class token (or the patch-token mean for GAP models) after the
  pre-logits layer when the model has one. The paper's few-shot features.
- ``token``: the final class token after the last LayerNorm (no pre-logits layer).
- ``gap``: the mean of the final patch tokens.
- ``pixels``: the preprocessed input itself, flattened (a baseline that needs no model).

Features are cached under a key made of the model's weights and config, the
images' bytes, the preprocessing and the representation, so a sweep over
shots, seeds and L2 strengths extracts them once.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..errors import ConfigError, InputError
from ..utils import PathLike, atomic_path, write_json_atomic

REPRESENTATIONS = ("pre_logits", "token", "gap", "pixels")
ArrayLike = Union[np.ndarray, torch.Tensor]


def _as_uint8_nchw(images: ArrayLike) -> torch.Tensor:
    x = torch.as_tensor(images)
    if x.ndim == 3:  # [N, H, W] grayscale
        x = x.unsqueeze(1)
    if x.ndim != 4:
        raise InputError(f"images must be [N, H, W] or [N, C, H, W], got shape {tuple(x.shape)}")
    return x


def prepare_images(images: ArrayLike, img_size: Sequence[int], in_chans: int,
                   preprocessing: Optional[Dict[str, Any]] = None) -> torch.Tensor:
    """uint8 images [N, (C,) H, W] (0..255) -> the model's float input [N, in_chans, *img_size].

    Channels are adapted (gray -> RGB by repetition, RGB -> gray by the mean),
    the images are resized to the model size when they differ (bilinear,
    antialiased), then normalised with ``preprocessing['mean'|'std']``
    (default 0.5 / 0.5, i.e. [-1, 1]).
    """
    x = _as_uint8_nchw(images)
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    c = x.shape[1]
    if c != in_chans:
        if c == 1:
            x = x.expand(-1, in_chans, -1, -1)
        elif in_chans == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise InputError(f"cannot feed {c}-channel images to a {in_chans}-channel model")
    size = (int(img_size[0]), int(img_size[1]))
    if tuple(x.shape[-2:]) != size:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    pre = preprocessing or {}
    mean = torch.as_tensor(pre.get("mean", [0.5]), dtype=torch.float32).flatten()
    std = torch.as_tensor(pre.get("std", [0.5]), dtype=torch.float32).flatten()
    if mean.numel() not in (1, in_chans) or std.numel() not in (1, in_chans):
        mean, std = mean.mean().reshape(1), std.mean().reshape(1)  # e.g. RGB statistics for a gray model
    return (x - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def model_preprocessing(model: torch.nn.Module) -> Dict[str, Any]:
    """The normalisation the model was trained with (its checkpoint's record), or mean = std = 0.5."""
    pre = model.meta.preprocessing or {}
    return {"mean": list(pre.get("mean", [0.5])), "std": list(pre.get("std", [0.5]))}


@torch.no_grad()
def represent(model: torch.nn.Module, x: torch.Tensor, representation: str = "pre_logits") -> torch.Tensor:
    """Features [B, D] of a batch of model inputs."""
    if representation == "pixels":
        return x.flatten(1)
    tokens = model.forward_features(x)
    if representation == "pre_logits":
        return model.forward_head(tokens, pre_logits=True)
    if representation == "token":
        if not model.config.class_token:
            raise ConfigError("representation 'token' needs a class token; this model has none: use 'gap'")
        return tokens[:, 0]
    if representation == "gap":
        return tokens[:, model.config.num_prefix_tokens:].mean(dim=1)
    raise ConfigError(f"unknown representation {representation!r}: use one of {', '.join(REPRESENTATIONS)}")


@torch.no_grad()
def extract_features(model: Optional[torch.nn.Module], images: ArrayLike, *, representation: str = "pre_logits",
                     batch_size: int = 256, device: Union[None, str, torch.device] = None,
                     img_size: Optional[Sequence[int]] = None, preprocessing: Optional[Dict[str, Any]] = None,
                     progress: bool = True, desc: str = "features") -> np.ndarray:
    """Features float32 [N, D] of uint8 images [N, (C,) H, W], computed in batches with a progress bar.

    The images are prepared for the model (:func:`prepare_images`) with its
    size and channels and the given ``preprocessing`` (default: the model's
    own record). ``model`` may be None for ``representation='pixels'`` (then
    ``img_size`` defaults to the images' size).
    """
    if representation not in REPRESENTATIONS:
        raise ConfigError(f"unknown representation {representation!r}: use one of {', '.join(REPRESENTATIONS)}")
    x_all = _as_uint8_nchw(images)
    if model is None:
        if representation != "pixels":
            raise ConfigError(f"representation {representation!r} needs a model")
        size, chans, pre = img_size or x_all.shape[-2:], x_all.shape[1], preprocessing
        dev = torch.device("cpu")
    else:
        cfg = model.config
        size, chans = img_size or cfg.img_size, cfg.in_chans
        pre = preprocessing if preprocessing is not None else model_preprocessing(model)
        dev = torch.device(device) if device is not None else next(model.parameters()).device
        model.eval().to(dev)
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    out = []
    n = x_all.shape[0]
    for start in tqdm(range(0, n, batch_size), desc=desc, disable=not progress, unit="batch",
                      total=(n + batch_size - 1) // batch_size, leave=False):
        x = prepare_images(x_all[start:start + batch_size], size, chans, pre).to(dev)
        out.append(represent(model, x, representation).float().cpu())
    if not out:
        raise InputError("no images given")
    return torch.cat(out).numpy()


# --- the cache ---------------------------------------------------------------------------
def fingerprint_model(model: torch.nn.Module) -> str:
    """sha256 of the model's config and every tensor of its state dict (names, shapes, dtypes, bytes)."""
    h = hashlib.sha256()
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):
        h.update(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def fingerprint_array(images: ArrayLike) -> str:
    """sha256 of an image array (shape, dtype and bytes)."""
    arr = np.ascontiguousarray(torch.as_tensor(images).cpu().numpy())
    h = hashlib.sha256(f"{arr.shape}:{arr.dtype}".encode())
    h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


class FeatureCache:
    """Features on disk, one ``.npy`` per key (plus a ``.json`` saying what the key stands for).

    Files are written atomically and read with ``allow_pickle=False``.
    """

    def __init__(self, root: PathLike):
        self.root = Path(root).expanduser()

    @staticmethod
    def key(parts: Dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]

    def path(self, key: str) -> Path:
        """The file of a cache entry."""
        return self.root / f"{key}.npy"

    def get(self, key: str) -> Optional[np.ndarray]:
        """The cached features of ``key``, or None (also for a damaged entry, which is recomputed)."""
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            return np.load(p, allow_pickle=False)
        except (ValueError, OSError):  # a damaged cache entry is recomputed, not trusted
            return None

    def put(self, key: str, value: np.ndarray, parts: Dict[str, Any]) -> Path:
        """Store features under ``key`` (atomically), with ``parts`` beside them as JSON; returns the path."""
        p = self.path(key)
        with atomic_path(p) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(value), allow_pickle=False)
        write_json_atomic(p.with_suffix(".json"), {**parts, "shape": list(value.shape)})
        return p


def cached_features(model: Optional[torch.nn.Module], images: ArrayLike, *, cache_dir: Optional[PathLike],
                    data_id: str = "", representation: str = "pre_logits", batch_size: int = 256,
                    device: Union[None, str, torch.device] = None, img_size: Optional[Sequence[int]] = None,
                    preprocessing: Optional[Dict[str, Any]] = None, progress: bool = True,
                    model_id: Optional[str] = None, desc: str = "features") -> np.ndarray:
    """:func:`extract_features`, read from / written to ``cache_dir`` (no cache when it is None).

    The key covers the model (``model_id``, default the sha256 of its weights
    and config), the images' bytes, ``data_id`` (a readable name), the
    preprocessing, the input size and the representation.
    """
    if cache_dir is None:
        return extract_features(model, images, representation=representation, batch_size=batch_size,
                                device=device, img_size=img_size, preprocessing=preprocessing,
                                progress=progress, desc=desc)
    if model is not None:
        pre = preprocessing if preprocessing is not None else model_preprocessing(model)
        size = list(img_size or model.config.img_size)
        mid = model_id or fingerprint_model(model)
    else:
        pre, size, mid = preprocessing, list(img_size or torch.as_tensor(images).shape[-2:]), "none"
    parts = {"model": mid, "data": data_id, "images": fingerprint_array(images), "representation": representation,
             "preprocessing": pre, "img_size": size, "version": 1}
    cache = FeatureCache(cache_dir)
    key = cache.key(parts)
    hit = cache.get(key)
    if hit is not None and hit.shape[0] == torch.as_tensor(images).shape[0]:
        return hit
    feats = extract_features(model, images, representation=representation, batch_size=batch_size, device=device,
                             img_size=img_size, preprocessing=preprocessing, progress=progress, desc=desc)
    cache.put(key, feats, parts)
    return feats
