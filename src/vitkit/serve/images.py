"""Uploaded bytes -> the model's input, checked at every step (before any image joins a batch).

The format is recognised from the bytes (their signature), never from a file name or a Content-Type;
only the recognised format's decoder runs (PIL's ``formats=``). The pixel count is read from the header
and refused past the limit before anything is decoded (a decompression bomb costs nothing). Decoding
and preprocessing are vitkit's own (:func:`vitkit.data.preprocess.load_image`,
:func:`vitkit.predict.model_input`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from PIL import Image

from ..data.preprocess import ImageError, ImageTooLarge, Preset, load_image
from ..predict import geometry

# (signature test, PIL format name, media type)
_SIGNATURES = (
    (lambda b: b.startswith(b"\xff\xd8\xff"), "JPEG", "image/jpeg"),
    (lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"), "PNG", "image/png"),
    (lambda b: b[:6] in (b"GIF87a", b"GIF89a"), "GIF", "image/gif"),
    (lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP", "WEBP", "image/webp"),
    (lambda b: b[:2] == b"BM", "BMP", "image/bmp"),
    (lambda b: b[:4] in (b"II*\x00", b"MM\x00*"), "TIFF", "image/tiff"),
    (lambda b: len(b) > 2 and b[:1] == b"P" and b[1:2] in b"123456" and b[2:3] in b" \t\r\n#", "PPM",
     "image/x-portable-anymap"),
)
FORMATS = tuple(sorted({name for _, name, _ in _SIGNATURES}))


class BadImage(ValueError):
    """An upload that is not an image the server takes: ``status`` (400, 413, 415, 422), ``error`` (a code)."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail


def sniff(data: bytes) -> Optional[Tuple[str, str]]:
    """(PIL format, media type) recognised from the first bytes, or None."""
    head = bytes(data[:16])
    for test, fmt, media in _SIGNATURES:
        if test(head):
            return fmt, media
    return None


def _describe_start(data: bytes) -> str:
    head = bytes(data[:8])
    if head and all(32 <= c < 127 or c in (9, 10, 13) for c in head):
        return f"text ({head.decode('ascii')!r}...)"
    return "bytes " + head.hex(" ")


@dataclass
class Decoded:
    """One upload ready to join a batch."""

    name: str
    crop: torch.Tensor  # the pixels that reach the model, [3, H, W] in 0..255 (normalised with the batch)
    format: str
    width: int
    height: int
    geometry: str
    normalised: bool = False  # crop is already the model's input [C, H, W] (a v2 FP32 tensor, preprocessed)


def decode(data: bytes, pre: Preset, *, name: str = "image", max_pixels: int) -> Decoded:
    """Check, decode, resize and crop one upload (:meth:`Preset.crop`; the normalisation runs on the batch,
    on the inference thread), or raise :class:`BadImage` naming what is wrong with it."""
    if not data:
        raise BadImage(400, "empty_image", f"{name}: the upload is empty (0 bytes)")
    kind = sniff(data)
    if kind is None:
        raise BadImage(415, "not_an_image", f"{name}: not an image in a format the server reads "
                       f"({', '.join(FORMATS)}): it begins with {_describe_start(data)}")
    fmt, _ = kind
    try:
        img = load_image(data, max_pixels=max_pixels, formats=[fmt], name=name)
    except ImageTooLarge as err:
        raise BadImage(413, "too_many_pixels", str(err)) from None
    except ImageError as err:
        raise BadImage(422, "undecodable_image", str(err)) from None
    try:
        crop = pre.crop(img)
    except (ImageError, ValueError, RuntimeError) as err:  # e.g. an image too small to resize
        raise BadImage(422, "unusable_image", f"{name}: {err}") from None
    return Decoded(name, crop, fmt, img.width, img.height, geometry(pre, img.width, img.height))


def overlay_png(crop: torch.Tensor, heat: torch.Tensor, alpha: float = 0.55) -> bytes:
    """The crop [3, H, W] (0..255) with a rollout map [H, W] in [0, 1] laid over it as a heat map, as PNG."""
    import io

    import numpy as np

    rgb = crop.round().clamp(0, 255).permute(1, 2, 0).numpy().astype(np.float32)
    h = heat.clamp(0, 1).numpy().astype(np.float32)
    # a perceptually ordered ramp (black-purple-red-yellow-white, close to matplotlib's inferno)
    stops = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], np.float32)
    pos = h * (len(stops) - 1)
    lo = np.clip(np.floor(pos).astype(int), 0, len(stops) - 2)
    frac = (pos - lo)[..., None]
    colour = stops[lo] * (1 - frac) + stops[lo + 1] * frac
    out = (rgb * (1 - alpha) + colour * alpha).round().clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(out).save(buf, format="PNG")
    return buf.getvalue()
