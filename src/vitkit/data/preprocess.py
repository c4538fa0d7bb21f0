"""Image decoding and the preprocessing presets that match each checkpoint family exactly.

A preset is data: how to resize (shorter side, a fixed square, or squash to
the model size), with which filter, the centre crop, and the normalisation. The presets reproduce
the evaluation pipelines of the checkpoints' owners on PIL images:

- ``torchvision`` (IMAGENET1K_V1 weights): shorter side to 256, bilinear
  (PIL, so antialiased), centre crop 224, ImageNet mean/std.
- ``torchvision-swag``: shorter side to the model size, bicubic, centre crop,
  ImageNet mean/std (the SWAG E2E / linear-classifier weights).
- ``authors``: the paper's code (``vit_jax``): squash to the model size with a
  plain bilinear resize (TF's ``tf.image.resize``: half-pixel centres, no
  antialias), then ``(x - 127.5) / 127.5``, i.e. mean = std = 0.5.
- ``hf``: Hugging Face ``ViTImageProcessor``: squash to the model size with
  PIL bilinear, mean = std = 0.5. A ``preprocessor_config.json`` with a
  centre crop (``DeiTImageProcessor``) is read as ``resize_mode="square"``:
  resize to a ``resize`` x ``resize`` square (aspect ratio not kept), then
  crop with Hugging Face's offsets (``crop_rounding="floor"``).
- ``timm``: shorter side to ``floor(size / 0.9)``, bicubic, centre crop,
  mean = std = 0.5 (timm's ViT pretrained configs); ``timm-imagenet`` is the
  same with ImageNet mean/std (DeiT-style weights).

``load_image`` turns any file PIL reads into an RGB image: grayscale,
palette, RGBA / LA (composited on white), CMYK and 16-bit / float images are
converted, and a corrupt or unreadable file raises :class:`ImageError`
(a ValueError) naming the file.
"""
from __future__ import annotations

import dataclasses
import io
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps

from ..errors import ConfigError, DataError
from ..models.meta import AUTHORS_PREPROCESSING

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's pixel statistics
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
_PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST,
                "lanczos": Image.LANCZOS}

ImageLike = Union[str, Path, Image.Image]


class ImageError(ValueError):
    """A file that is not a readable image (corrupt, truncated, unknown format)."""


# --- decoding -----------------------------------------------------------------
def to_rgb(img: Image.Image, background: Tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB.

    Transparent images are composited on ``background``; 16-bit and 32-bit
    integer images are scaled to 8 bits (not clipped); float images are taken
    as [0, 1] when their maximum is at most 1, else as [0, 255].
    """
    mode = img.mode
    if mode == "RGB":
        return img
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
        mode = img.mode
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, background + (255,))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    if mode.startswith("I") or mode == "F":
        arr = np.asarray(img).astype(np.float64)
        if mode == "F":
            peak = float(np.nanmax(arr)) if arr.size else 0.0
            arr = arr * 255.0 if peak <= 1.0 else arr
        elif mode in ("I;16", "I;16B", "I;16L", "I;16N") or (arr.size and arr.max() > 255):
            arr = arr / 257.0  # 65535 -> 255
        arr = np.clip(np.nan_to_num(arr), 0, 255).round().astype(np.uint8)
        return Image.fromarray(arr, mode="L").convert("RGB")
    return img.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV


class ImageTooLarge(ImageError):
    """An image whose header declares more pixels than allowed (refused before any pixel is decoded)."""


def load_image(source: Union[ImageLike, bytes], *, exif_transpose: bool = True, max_pixels: Optional[int] = None,
               formats: Optional[Sequence[str]] = None, name: Optional[str] = None) -> Image.Image:
    """Read an image file or the bytes of one (or take a PIL image) and return it as 8-bit RGB.

    ``exif_transpose`` applies the EXIF orientation tag (photos from phones);
    the reference pipelines of torchvision and timm do not, so pass False to
    reproduce them bit for bit on such files. ``max_pixels``: refuse (:class:`ImageTooLarge`) an image
    whose header declares more pixels, before decoding any (a decompression bomb costs nothing);
    ``formats``: the PIL decoders allowed (e.g. ``["PNG"]``); ``name``: how errors name bytes.
    """
    if isinstance(source, Image.Image):
        img = source
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            path, opener = (name or "<image bytes>"), io.BytesIO(bytes(source))
        else:
            path = opener = Path(source)
            if not path.exists():
                raise FileNotFoundError(f"image {path} does not exist")
            if path.is_dir():
                raise ImageError(f"{path} is a folder, not an image")
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Corrupt EXIF", UserWarning)  # the pixels are fine
                with Image.open(opener, formats=formats) as opened:  # reads the header only
                    w, h = opened.size
                    if max_pixels is not None and w * h > max_pixels:
                        raise ImageTooLarge(f"{path}: refused, {w}x{h} = {w * h:,} pixels is more than the "
                                            f"{max_pixels:,} allowed")
                    opened.load()  # decode now, so truncated data fails here and not later
                    img = opened.copy()
        except ImageTooLarge:
            raise
        except Image.DecompressionBombError as err:
            raise ImageTooLarge(f"{path}: refused, the image is implausibly large ({err})") from None
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError... for bad data
            reason = str(err) or type(err).__name__
            raise ImageError(f"{path} is not a readable image ({reason}): the file is corrupt, truncated "
                             f"or not an image") from None
    if exif_transpose:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Corrupt EXIF", UserWarning)
                img = ImageOps.exif_transpose(img)
        except Exception:  # a broken EXIF block must not stop classification
            pass
    return to_rgb(img)


def find_images(paths: Sequence[Union[str, Path]], recursive: bool = True) -> List[Path]:
    """Expand files and folders into a sorted list of image files (folders by extension)."""
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            pattern = "**/*" if recursive else "*"
            found = sorted(q for q in p.glob(pattern) if q.is_file() and q.suffix.lower() in IMAGE_EXTENSIONS)
            if not found:
                raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in folder {p}")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist")
    return out


# --- presets --------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """One evaluation pipeline: resize -> centre crop -> [0, 1] -> normalise.

    ``resize_mode``: "shorter" resizes the shorter side to ``resize`` keeping
    the aspect ratio, then centre-crops ``size``; "square" resizes to a
    ``resize`` x ``resize`` square (the aspect ratio is not kept, as Hugging
    Face's ``DeiTImageProcessor`` does), then centre-crops ``size``; "squash"
    resizes straight to ``size`` (no crop). ``crop_rounding``: where the crop
    starts when the margin is odd: "round" (torchvision, timm:
    ``round(margin / 2)``) or "floor" (Hugging Face: ``margin // 2``).
    ``backend``: "pil" resizes the 8-bit image with PIL (antialiased, as
    torchvision / timm / HF do on PIL images); "tensor" resizes the float image
    with ``F.interpolate`` without antialias (TF's resize, as the authors' code
    does).
    """

    name: str
    size: Tuple[int, int] = (224, 224)  # (height, width) reaching the model
    resize: Optional[int] = 256  # shorter side ("shorter") or square side ("square") before the crop
    resize_mode: str = "shorter"  # shorter | square | squash
    interpolation: str = "bilinear"  # bilinear | bicubic | nearest | lanczos
    backend: str = "pil"  # pil | tensor
    mean: Tuple[float, float, float] = IMAGENET_MEAN
    std: Tuple[float, float, float] = IMAGENET_STD
    description: str = ""  # where the pipeline comes from (what it does: :meth:`describe`, from the fields)
    crop_pct: Optional[float] = None  # crop / resize, kept when the size changes (timm's 0.9; else derived)
    crop_rounding: str = "round"  # round (torchvision, timm) | floor (Hugging Face)

    def __post_init__(self) -> None:
        size = self.size if isinstance(self.size, (tuple, list)) else (self.size, self.size)
        object.__setattr__(self, "size", (int(size[0]), int(size[1])))
        mean, std = tuple(float(v) for v in self.mean), tuple(float(v) for v in self.std)
        if len(mean) == 1 and len(std) == 1:  # single-channel statistics (e.g. Fashion-MNIST) serve all channels
            mean, std = mean * 3, std * 3
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        if self.resize_mode not in ("shorter", "square", "squash"):
            raise ConfigError(f"resize_mode={self.resize_mode!r}: use 'shorter', 'square' or 'squash'")
        if self.crop_rounding not in ("round", "floor"):
            raise ConfigError(f"crop_rounding={self.crop_rounding!r}: use 'round' or 'floor'")
        if self.interpolation not in _PIL_FILTERS:
            raise ConfigError(f"interpolation={self.interpolation!r}: use one of {', '.join(_PIL_FILTERS)}")
        if self.backend not in ("pil", "tensor"):
            raise ConfigError(f"backend={self.backend!r}: use 'pil' or 'tensor'")
        if self.backend == "tensor" and self.interpolation not in ("bilinear", "bicubic", "nearest"):
            raise ConfigError("the tensor backend resizes with bilinear, bicubic or nearest")
        if self.resize_mode != "squash" and not self.resize:
            raise ConfigError(f"resize_mode={self.resize_mode!r} needs a resize size")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(f"mean and std need 3 values each, std > 0 (got {self.mean}, {self.std})")

    def describe(self) -> str:
        """One line: where the pipeline comes from, then what it does at its size, written from the fields
        (so a preset adapted with :meth:`with_size` never shows the sizes it was declared at)."""
        origin = self.description.split(": ", 1)[0] or self.name  # older files stored "origin: steps"
        h, w = self.size
        crop = str(h) if h == w else f"{h}x{w}"
        how = self.interpolation + (" (antialiased)" if self.backend == "pil" and self.interpolation != "nearest"
                                    else " (tensor, no antialias)" if self.backend == "tensor" else "")
        if self.resize_mode == "squash":
            steps = f"resize to {h}x{w} {how}"
        elif self.resize_mode == "shorter":
            steps = f"shorter side {self.resize} {how}, centre crop {crop}"
        else:
            steps = f"resize to {self.resize}x{self.resize} {how}, centre crop {crop}"
        named = {IMAGENET_MEAN + IMAGENET_STD: "ImageNet mean/std", HALF + HALF: "mean = std = 0.5",
                 CLIP_MEAN + CLIP_STD: "CLIP mean/std"}
        norm = named.get(self.mean + self.std) or (f"mean {', '.join(f'{v:g}' for v in self.mean)}, "
                                                   f"std {', '.join(f'{v:g}' for v in self.std)}")
        return f"{origin}: {steps}, {norm}"

    def crop_fraction(self) -> float:
        if self.resize_mode == "squash":
            return 1.0
        return self.crop_pct or min(self.size) / float(self.resize)

    def with_size(self, size: Union[int, Sequence[int]]) -> "Preset":
        """The same pipeline for another model resolution (the crop fraction is kept)."""
        size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if size == self.size:
            return self
        resize = None if self.resize_mode == "squash" else int(math.floor(min(size) / self.crop_fraction() + 1e-9))
        return dataclasses.replace(self, size=size, resize=resize)

    # --- the pipeline -----------------------------------------------------------
    def crop(self, img: ImageLike) -> torch.Tensor:
        """Resize and crop: the pixels that reach the model, float [3, H, W] in 0..255 (before normalising)."""
        img = load_image(img) if not isinstance(img, Image.Image) else to_rgb(img)
        if self.backend == "pil":
            out = self._pil_resize_crop(img)
            return torch.from_numpy(np.array(out, dtype=np.uint8)).permute(2, 0, 1).float()
        x = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float()[None]
        if self.resize_mode == "squash":
            return _interp(x, self.size, self.interpolation)[0]
        x = _interp(x, self._resized(x.shape[-1], x.shape[-2])[::-1], self.interpolation)
        return _center_crop_tensor(x, self.size, self.crop_rounding)[0]

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """0..255 pixels [..., C, H, W] -> the model's input (C = 3, or 1 for grayscale models)."""
        c = pixels.shape[-3]
        mean = torch.tensor(self.mean[:c], dtype=torch.float32).view(c, 1, 1)
        std = torch.tensor(self.std[:c], dtype=torch.float32).view(c, 1, 1)
        return (pixels.float() / 255.0 - mean) / std

    def __call__(self, img: ImageLike) -> torch.Tensor:
        """Image (path or PIL) -> normalised tensor [3, H, W]."""
        return self.normalize(self.crop(img))

    def _pil_resize_crop(self, img: Image.Image) -> Image.Image:
        flt = _PIL_FILTERS[self.interpolation]
        if self.resize_mode == "squash":
            h, w = self.size
            return img.resize((w, h), flt) if img.size != (w, h) else img
        new_w, new_h = self._resized(img.width, img.height)
        if (new_w, new_h) != img.size:
            img = img.resize((new_w, new_h), flt)
        return _center_crop_pil(img, self.size, self.crop_rounding)

    def _resized(self, w: int, h: int) -> Tuple[int, int]:
        """(new_w, new_h) before the crop."""
        if self.resize_mode == "square":
            return self.resize, self.resize
        return _shorter_side(w, h, self.resize)

    # --- (de)serialisation (stored in vitkit.json) ---------------------------------
    def to_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["size"], d["mean"], d["std"] = list(self.size), list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Preset":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown preprocessing fields {unknown} (known: {sorted(names)})")
        d = dict(d)
        d.setdefault("name", "custom")
        if "resize" not in d and "resize_mode" not in d:  # a bare mean/std record: resize to the model size
            d.update(resize=None, resize_mode="squash")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def to_gray(pixels: torch.Tensor) -> torch.Tensor:
    """RGB pixels [3, H, W] -> luma [1, H, W] (ITU-R 601, PIL's "L"), for single-channel models."""
    weights = torch.tensor([0.299, 0.587, 0.114], dtype=pixels.dtype).view(3, 1, 1)
    return (pixels * weights).sum(dim=-3, keepdim=True)


def _shorter_side(w: int, h: int, target: int) -> Tuple[int, int]:
    """(new_w, new_h) with the shorter side = target (torchvision's rounding: int() of the long side)."""
    if w <= h:
        return target, int(target * h / w)
    return int(target * w / h), target


def _crop_start(margin: int, rounding: str) -> int:
    """Offset of a centre crop: torchvision / timm round half to even, Hugging Face floors."""
    return margin // 2 if rounding == "floor" else int(round(margin / 2.0))


def _center_crop_pil(img: Image.Image, size: Tuple[int, int], rounding: str = "round") -> Image.Image:
    ch, cw = size
    if img.width < cw or img.height < ch:  # pad with black, as torchvision does
        canvas = Image.new("RGB", (max(cw, img.width), max(ch, img.height)))
        canvas.paste(img, ((canvas.width - img.width) // 2, (canvas.height - img.height) // 2))
        img = canvas
    top, left = _crop_start(img.height - ch, rounding), _crop_start(img.width - cw, rounding)
    return img.crop((left, top, left + cw, top + ch))


def _center_crop_tensor(x: torch.Tensor, size: Tuple[int, int], rounding: str = "round") -> torch.Tensor:
    ch, cw = size
    h, w = x.shape[-2:]
    if h < ch or w < cw:
        ph, pw = max(ch - h, 0), max(cw - w, 0)
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        h, w = x.shape[-2:]
    top, left = _crop_start(h - ch, rounding), _crop_start(w - cw, rounding)
    return x[..., top:top + ch, left:left + cw]


def _interp(x: torch.Tensor, size: Sequence[int], mode: str) -> torch.Tensor:
    size = (int(size[0]), int(size[1]))
    if tuple(x.shape[-2:]) == size:
        return x
    kw = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(x, size=size, mode=mode, **kw)


PRESETS: Dict[str, Preset] = {p.name: p for p in (
    Preset("torchvision", (224, 224), 256, "shorter", "bilinear", "pil", IMAGENET_MEAN, IMAGENET_STD,
           "torchvision IMAGENET1K_V1"),
    Preset("torchvision-swag", (384, 384), 384, "shorter", "bicubic", "pil", IMAGENET_MEAN, IMAGENET_STD,
           "torchvision SWAG weights"),
    Preset(**AUTHORS_PREPROCESSING),
    Preset("hf", (224, 224), None, "squash", "bilinear", "pil", HALF, HALF,
           "Hugging Face ViTImageProcessor"),
    Preset("timm", (224, 224), 248, "shorter", "bicubic", "pil", HALF, HALF,
           "timm ViT (crop_pct 0.9)", 0.9),
    Preset("timm-imagenet", (224, 224), 248, "shorter", "bicubic", "pil", IMAGENET_MEAN, IMAGENET_STD,
           "timm / DeiT (crop_pct 0.9)", 0.9),
    Preset("clip", (224, 224), 224, "shorter", "bicubic", "pil", CLIP_MEAN, CLIP_STD,
           "OpenAI CLIP / OpenCLIP", 1.0),
)}
_ALIASES = {"imagenet1k_v1": "torchvision", "tv": "torchvision", "swag": "torchvision-swag",
            "vit_jax": "authors", "big_vision": "authors", "jax": "authors", "npz": "authors",
            "huggingface": "hf", "transformers": "hf", "deit": "timm-imagenet"}


def list_presets() -> List[str]:
    return list(PRESETS)


def get_preset(name: Union[str, Preset, Dict[str, Any]], img_size: Union[None, int, Sequence[int]] = None) -> Preset:
    """A preset by name (or a dict from vitkit.json), adapted to ``img_size`` when given.

    >>> get_preset("torchvision").resize, get_preset("torchvision", 384).resize
    (256, 438)
    """
    if isinstance(name, Preset):
        preset = name
    elif isinstance(name, dict):
        preset = Preset.from_dict(name)
    else:
        key = _ALIASES.get(str(name).lower(), str(name).lower())
        if key not in PRESETS:
            raise ConfigError(f"unknown preprocessing preset {name!r}: use one of {', '.join(PRESETS)}")
        preset = PRESETS[key]
    return preset.with_size(img_size) if img_size is not None else preset


def imagenet_classes() -> List[str]:
    """The 1000 ImageNet-1k class names in index order (the torchvision spelling)."""
    text = (Path(__file__).with_name("imagenet_classes.txt")).read_text(encoding="utf-8")
    names = [line for line in text.splitlines() if line]
    if len(names) != 1000:
        raise DataError(f"imagenet_classes.txt has {len(names)} names, expected 1000: reinstall vitkit")
    return names
