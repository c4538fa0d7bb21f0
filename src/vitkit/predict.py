"""Image classification with any loaded model: files or folders in, top-k labels out.

Images are decoded with :func:`vitkit.data.preprocess.load_image` (grayscale,
palette, RGBA, CMYK and 16-bit files converted), preprocessed with the model's
own preset (``model.meta.preprocessing``, else the one named), batched, and
classified. A file that cannot be read is reported in its result and
skipped; the others are still classified. ``save_crop`` writes the exact
pixels that reached the model (after resize and crop, before normalising).
"""
from __future__ import annotations

import csv
import io
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .data.preprocess import ImageError, Preset, get_preset, load_image, to_gray
from .errors import InputError, VitkitWarning
from .models.meta import AUTHORS_PREPROCESSING
from .utils import PathLike, atomic_path


@dataclass
class Prediction:
    source: str
    top: List[Dict[str, Any]] = field(default_factory=list)  # [{"rank", "index", "label", "prob"}]
    crop: Optional[str] = None  # where the model's input crop was saved
    error: Optional[str] = None
    geometry: Optional[str] = None  # how the image became the model's input (see :func:`geometry`)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"path": self.source}
        if self.error is not None:
            d["error"] = self.error
        else:
            d["top"] = self.top
            if self.geometry:
                d["geometry"] = self.geometry
            if self.crop:
                d["crop"] = self.crop
        return d


def create_transform(model, preset: Union[None, str, Preset, Dict[str, Any]] = None) -> Preset:
    """The model's own preprocessing as a callable (image or path -> normalised tensor [C, H, W]) at the
    model's resolution: ``preset`` when given, else what its checkpoint says (``model.meta.preprocessing``),
    else (a freshly built model, or weights that said nothing) the default, the paper authors' pipeline, with a
    warning that says so (``model.pretrained_cfg["default_preprocessing"]`` marks it too)."""
    size = model.config.img_size
    if preset is not None:
        return get_preset(preset, size)
    if model.meta.preprocessing:
        return get_preset(model.meta.preprocessing, size)
    warnings.warn("the model's weights came with no preprocessing: using the default (the paper authors': "
                  "squash, mean = std = 0.5); pass a preset (torchvision, hf, authors, timm) if they were trained "
                  "with another", VitkitWarning, stacklevel=2)
    return get_preset(AUTHORS_PREPROCESSING, size)


def classify(weights, images: Sequence[Union[PathLike, Image.Image]], *, topk: int = 5, batch_size: int = 32,
             preset: Union[None, str, Preset, Dict[str, Any]] = None, save_crop: Optional[PathLike] = None,
             progress: bool = True, device: Union[str, torch.device, None] = None,
             offline: Optional[bool] = None) -> List[Prediction]:
    """Top-``topk`` classes of each image, in input order (unreadable images as results with ``error``).

    ``weights``: a model, or anything :func:`vitkit.load_weights` takes (path, known name, Hub id, URL).

    >>> preds = vitkit.classify("torchvision/vit_b_16", ["chelsea.png"])      # doctest: +SKIP
    >>> preds[0].top[0]["label"], preds[0].top[0]["prob"]                      # doctest: +SKIP
    ('Egyptian cat', 0.660...)
    """
    if not isinstance(weights, torch.nn.Module):
        from .checkpoints import load_weights
        weights = load_weights(weights, offline=offline, progress=progress)
    if device is not None:
        weights = weights.to(device)
    return list(iter_classify(weights, images, topk=topk, batch_size=batch_size, preset=preset,
                              save_crop=save_crop, progress=progress))


def iter_classify(model, images: Sequence[Union[PathLike, Image.Image]], *, topk: int = 5, batch_size: int = 32,
                  preset: Union[None, str, Preset, Dict[str, Any]] = None, save_crop: Optional[PathLike] = None,
                  progress: bool = True) -> Iterator[Prediction]:
    """Yield one :class:`Prediction` per image, in input order, as each batch is done (on the model's device)."""
    pre, k = _checked_setup(model, topk, batch_size, preset)
    labels = model.meta.labels
    device = next(model.parameters()).device
    gray = model.config.in_chans == 1
    crop_dir = Path(save_crop) if save_crop is not None else None
    if crop_dir is not None:
        crop_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    bar = None
    if progress and len(images) > 1:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(images), unit="img", desc="classify")
    used_names: Dict[str, int] = {}
    try:
        for start in range(0, len(images), batch_size):
            chunk = images[start:start + batch_size]
            results: List[Prediction] = []
            pixels: List[torch.Tensor] = []
            slots: List[int] = []
            for item in chunk:
                res, x = _read(item, _name(item, start + len(results)), pre, gray, crop_dir, used_names)
                if x is not None:
                    pixels.append(x)
                    slots.append(len(results))
                results.append(res)
            if pixels:
                with torch.inference_mode():
                    logits = model(torch.stack(pixels).to(device))
                for row, top in zip(slots, top_classes(logits, k, labels)):
                    if top is None:
                        results[row].error = NOT_FINITE
                    else:
                        results[row].top = top
            for res in results:
                yield res
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()


def _checked_setup(model, topk: int, batch_size: int, preset: Union[None, str, Preset, Dict[str, Any]]
                   ) -> Tuple[Preset, int]:
    """(the model's preprocessing, how many classes to show: ``topk``, or all the model's classes with a
    warning when it has fewer); InputError for arguments or a model that cannot classify images."""
    if topk < 1:
        raise InputError(f"topk must be at least 1, got {topk}")
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    pre = create_transform(model, preset)
    n_classes = model.config.num_classes
    if n_classes == 0:
        raise InputError("the model has no classification head (num_classes=0): load a checkpoint with a head")
    k = min(topk, n_classes)
    if k < topk:  # stacklevel: past this function and the generator, to the code that iterates it
        warnings.warn(f"topk={topk} is more than the model's {n_classes} classes: showing all {n_classes}",
                      VitkitWarning, stacklevel=3)
    if model.config.in_chans not in (1, 3):
        raise InputError(f"images have 3 (RGB) or 1 (gray) channels; the model takes {model.config.in_chans}")
    return pre, k


def _read(item: Union[PathLike, Image.Image], name: str, pre: Preset, gray: bool, crop_dir: Optional[Path],
          used_names: Dict[str, int]) -> Tuple[Prediction, Optional[torch.Tensor]]:
    """(the image's Prediction, still without classes; the model's input for it, None when the image cannot
    be read: the Prediction then holds the error). Saves the crop into ``crop_dir`` when given."""
    res = Prediction(name)
    try:
        img = load_image(item) if not isinstance(item, Image.Image) else item
        crop, x = model_input(pre, img, gray)
    except (ImageError, FileNotFoundError) as err:
        res.error = str(err)
        return res, None
    res.geometry = geometry(pre, img.width, img.height)
    if crop_dir is not None:
        res.crop = str(_save_crop(crop, crop_dir, name, used_names))
    return res, x


NOT_FINITE = ("the model's output is not finite (NaN or Inf): its weights hold non-finite values or overflow; "
              "use another checkpoint")


def model_input(pre: Preset, img: Image.Image, gray: bool = False):
    """(crop, input): the pixels that reach the model (float [3, H, W], 0..255, after resize and crop) and
    the normalised input tensor (one channel for a grayscale model)."""
    crop = pre.crop(img)
    return crop, normalized(pre, crop, gray)


def normalized(pre: Preset, crops: torch.Tensor, gray: bool = False) -> torch.Tensor:
    """Crops [..., 3, H, W] (0..255, from ``pre.crop``) -> the model's input (one channel for a grayscale model)."""
    return pre.normalize(to_gray(crops) if gray else crops)


def top_classes(logits: torch.Tensor, k: int,
                labels: Optional[Sequence[str]] = None) -> List[Optional[List[Dict[str, Any]]]]:
    """Per row of ``logits`` [B, classes]: the top-``k`` classes as ``[{"rank", "index", "label", "prob"}]``
    (softmax probabilities), or None where the row is not finite (no meaningful ranking exists)."""
    logits = torch.as_tensor(logits).float()
    probs = logits.softmax(dim=-1)
    p, idx = probs.topk(min(k, logits.shape[-1]), dim=-1)
    finite = torch.isfinite(logits).all(dim=-1).tolist()
    return [None if not finite[row] else
            [{"rank": r + 1, "index": int(i), "label": labels[int(i)] if labels else str(int(i)),
              "prob": round(float(q), 6)}
             for r, (q, i) in enumerate(zip(p[row].tolist(), idx[row].tolist()))]
            for row in range(logits.shape[0])]


def _name(item, i: int) -> str:
    return str(item) if not isinstance(item, Image.Image) else f"<image {i}>"


def _save_crop(crop: torch.Tensor, folder: Path, name: str, used: Dict[str, int]) -> Path:
    stem = Path(name).stem if not name.startswith("<") else "image"
    n = used.get(stem, 0)
    used[stem] = n + 1
    out = folder / (f"{stem}_crop.png" if n == 0 else f"{stem}_{n}_crop.png")
    arr = crop.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    with atomic_path(out) as tmp:
        Image.fromarray(np.ascontiguousarray(arr)).save(tmp, format="PNG")
    return out


def geometry(pre: Preset, w: int, h: int) -> str:
    """How a w x h image becomes the model's input under ``pre``: "451x300 -> 384x256 -> centre crop 224x224"."""
    ch, cw = pre.size
    if pre.resize_mode == "squash":
        return f"{w}x{h} -> {cw}x{ch} (resized, aspect ratio not kept)"
    nw, nh = pre._resized(w, h)
    return f"{w}x{h} -> {nw}x{nh} -> centre crop {cw}x{ch}"


def format_table(pred: Prediction) -> str:
    if not pred.ok:
        return f"{pred.source}\n  skipped: {pred.error}"
    lines = [pred.source + (f"  ({pred.geometry})" if pred.geometry else "")
             + (f"  (model input saved as {pred.crop})" if pred.crop else "")]
    for t in pred.top:
        lines.append(f"  {t['rank']:>2}. {t['prob'] * 100:6.2f}%  {t['label']}  [{t['index']}]")
    return "\n".join(lines)


def format_json(pred: Prediction) -> str:
    return json.dumps(pred.to_dict())


CSV_FIELDS = ("path", "rank", "index", "label", "prob", "error")


def write_csv(preds: Sequence[Prediction], path: PathLike) -> Path:
    """One row per image and rank (``path, rank, index, label, prob``); a skipped image gets one row with
    its ``error``. Written atomically."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for pred in preds:
        if not pred.ok:
            w.writerow({"path": pred.source, "error": pred.error})
        for t in pred.top:
            w.writerow({"path": pred.source, **{k: t[k] for k in ("rank", "index", "label", "prob")}})
    out = Path(path)
    with atomic_path(out) as tmp:
        tmp.write_text(buf.getvalue(), encoding="utf-8")
    return out
