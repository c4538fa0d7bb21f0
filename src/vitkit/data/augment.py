"""Batched, tensor-level augmentation and regularisation (torch ops only, whole batches at once).

Every function takes a batch [B, C, H, W] and a ``torch.Generator``, draws one random value per
sample with vectorised ops (no Python loop over samples) and is deterministic given the generator:

- :func:`pad_crop` random crop with padding (small images), :func:`flip`
- :func:`inception_crop` the authors' random-resized crop (area 8-100 %, aspect 3/4-4/3), flip folded in
- :func:`rand_augment` RandAugment (Cubuk et al. 2020): N ops of magnitude M per image
- :func:`random_erasing` (Zhong et al. 2020), :func:`mix` Mixup (Zhang et al. 2018) / CutMix (Yun et al. 2019)

:class:`BatchAugment` chains them as a recipe asks; :class:`EvalTransform` is the matching
deterministic transform for evaluation.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError


def _uniform(g: torch.Generator, n: int, lo: float = 0.0, hi: float = 1.0, device=None) -> Tensor:
    return torch.rand(n, generator=g, device=device) * (hi - lo) + lo


def _seeded_rng(g: torch.Generator) -> random.Random:
    return random.Random(int(torch.randint(0, 2 ** 62, (1,), generator=g)))


# --- crops and flips ------------------------------------------------------------------
def pad_crop(x: Tensor, pad: int, g: torch.Generator, fill: float = 0) -> Tensor:
    """Pad every side by ``pad`` and take a random crop of the original size, per sample."""
    if pad <= 0:
        return x
    b, c, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad), value=fill)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    rows = (oy[:, None] + torch.arange(h))[:, None, :, None]
    cols = (ox[:, None] + torch.arange(w))[:, None, None, :]
    return xp[torch.arange(b)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]


def flip(x: Tensor, g: torch.Generator, p: float = 0.5) -> Tensor:
    """Horizontal flip of a random half (probability ``p``) of the batch."""
    mask = torch.rand(x.shape[0], generator=g) < p
    return torch.where(mask[:, None, None, None], x.flip(-1), x)


def inception_crop(x: Tensor, size: Tuple[int, int], g: torch.Generator, scale: Tuple[float, float] = (0.08, 1.0),
                   ratio: Tuple[float, float] = (3 / 4, 4 / 3), hflip: float = 0.0) -> Tensor:
    """Random-resized crop (Szegedy et al. 2015; the paper's pre-training crop) of a float batch, resized
    bilinearly to ``size``; with ``hflip`` > 0 a random flip is folded into the same resampling."""
    b, _, h, w = x.shape
    area = _uniform(g, b, *scale)
    logr = _uniform(g, b, math.log(ratio[0]), math.log(ratio[1]))
    aspect = torch.exp(logr) * (h / w)  # width/height of the crop, in units of the image's fractions
    fw = torch.sqrt(area * aspect).clamp(max=1.0)
    fh = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = (_uniform(g, b) * (1 - fw) + fw / 2) * 2 - 1  # crop centre in [-1, 1]
    cy = (_uniform(g, b) * (1 - fh) + fh / 2) * 2 - 1
    sx = fw * torch.where(torch.rand(b, generator=g) < hflip, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, cx, fh, cy
    grid = F.affine_grid(theta.to(x.dtype), [b, x.shape[1], size[0], size[1]], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def resize(x: Tensor, size: Tuple[int, int]) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)


def center_crop(x: Tensor, size: Tuple[int, int]) -> Tensor:
    h, w = x.shape[-2:]
    top, left = max((h - size[0]) // 2, 0), max((w - size[1]) // 2, 0)
    return x[..., top:top + size[0], left:left + size[1]]


# --- RandAugment ---------------------------------------------------------------------------
def _blend(a: Tensor, b: Tensor, factor: Tensor) -> Tensor:
    return (b + (a - b) * factor.view(-1, 1, 1, 1)).clamp(0, 1)


def _gray(x: Tensor) -> Tensor:
    if x.shape[1] == 3:
        return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3]).expand_as(x)
    return x


def autocontrast(x: Tensor) -> Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 1.0 / (hi - lo).clamp(min=1e-6), torch.ones_like(hi))
    return torch.where(hi > lo, (x - lo) * scale, x)


def equalize(x: Tensor) -> Tensor:
    """Histogram equalisation per image and channel (256 bins), batched."""
    b, c, h, w = x.shape
    q = (x * 255).round().long().clamp(0, 255).view(b * c, h * w)
    hist = torch.zeros(b * c, 256).scatter_add_(1, q, torch.ones_like(q, dtype=torch.float32))
    cdf = hist.cumsum(1)
    cdf_min = torch.where(hist > 0, cdf, torch.full_like(cdf, float(h * w))).amin(1, keepdim=True)
    lut = ((cdf - cdf_min) / (h * w - cdf_min).clamp(min=1) * 255).clamp(0, 255)
    out = lut.gather(1, q) / 255
    flat = (hist.amax(1, keepdim=True) == h * w)  # single-valued channel: leave it
    return torch.where(flat, q.float() / 255, out).view(b, c, h, w)


def _sharpen(x: Tensor, factor: Tensor) -> Tensor:
    k = torch.tensor([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=x.dtype) / 13
    c = x.shape[1]
    smooth = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k.expand(c, 1, 3, 3).contiguous(), groups=c)
    return _blend(x, smooth, factor)


COLOR_OPS = ("identity", "autocontrast", "equalize", "solarize", "posterize", "color", "contrast",
             "brightness", "sharpness")
GEOMETRIC_OPS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
RAND_AUGMENT_OPS = COLOR_OPS + GEOMETRIC_OPS


def _color_op(name: str, x: Tensor, m: Tensor, sign: Tensor) -> Tensor:
    """Op ``name`` on the images ``x`` at their magnitudes ``m`` (per image, in [0, 1]) and signs."""
    f = 1.0 + 0.9 * m * sign  # enhancement factor in [0.1, 1.9]
    if name == "identity":
        return x
    if name == "autocontrast":
        return autocontrast(x)
    if name == "equalize":
        return equalize(x)
    if name == "solarize":
        thr = (1.0 - m).view(-1, 1, 1, 1)
        return torch.where(x >= thr, 1.0 - x, x)
    if name == "posterize":
        bits = (8 - torch.round(4 * m)).clamp(min=1)
        step = (2 ** (8 - bits)).view(-1, 1, 1, 1)
        return torch.div((x * 255).round(), step, rounding_mode="floor") * step / 255
    if name == "color":
        return _blend(x, _gray(x), f)
    if name == "contrast":
        mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
        return _blend(x, mean.expand_as(x), f)
    if name == "brightness":
        return _blend(x, torch.zeros_like(x), f)
    if name == "sharpness":
        return _sharpen(x, f)
    raise ConfigError(f"unknown op {name}")


def _affine_for(name: str, m: Tensor, sign: Tensor, h: int, w: int) -> Tensor:
    """Per-sample 2x3 matrices (normalised coordinates) mapping output to input pixels."""
    n = sign.shape[0]
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    if name == "rotate":
        a = math.radians(30.0) * m * sign
        theta[:, 0, 0], theta[:, 0, 1] = torch.cos(a), -torch.sin(a) * h / w
        theta[:, 1, 0], theta[:, 1, 1] = torch.sin(a) * w / h, torch.cos(a)
    elif name == "shear_x":
        theta[:, 0, 1] = 0.3 * m * sign * h / w
    elif name == "shear_y":
        theta[:, 1, 0] = 0.3 * m * sign * w / h
    elif name == "translate_x":
        theta[:, 0, 2] = 2 * 0.45 * m * sign
    elif name == "translate_y":
        theta[:, 1, 2] = 2 * 0.45 * m * sign
    return theta


def _warp(x: Tensor, theta: Tensor, fill: float) -> Tensor:
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    ones = torch.ones_like(x[:, :1])
    out = F.grid_sample(torch.cat([x, ones], 1), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    img, valid = out[:, :-1], out[:, -1:]
    return img + (1 - valid) * fill


def _magnitudes(g: torch.Generator, n: int, magnitude: float, std: float) -> Tensor:
    """``n`` magnitudes out of 10: ``magnitude``, or with ``std`` > 0 one normal draw (mean ``magnitude``,
    deviation ``std``; ``inf``: uniform in [0, magnitude]) for each, clipped to [0, 10] (timm's ``mstd``)."""
    if not std:
        return torch.full((n,), float(magnitude))
    if math.isinf(std):
        return _uniform(g, n, 0.0, magnitude)
    return (magnitude + std * torch.randn(n, generator=g)).clamp(0.0, 10.0)


def rand_augment(x: Tensor, g: torch.Generator, num_ops: int = 2, magnitude: float = 9.0,
                 ops: Sequence[str] = RAND_AUGMENT_OPS, fill: float = 0.5, magnitude_std: float = 0.0,
                 prob: float = 1.0) -> Tensor:
    """RandAugment on a float batch in [0, 1]: each image gets ``num_ops`` ops drawn uniformly from ``ops``,
    at magnitude ``magnitude`` out of 10. ``magnitude_std`` (timm's ``mstd``) jitters it for each image and
    op: a normal draw around ``magnitude`` with that deviation (``inf``: uniform in [0, magnitude]), clipped
    to [0, 10], as timm's RandAugment does. ``prob``: the chance that each drawn op is applied (timm's ``p``,
    0.5 in its RandAugment; 1 in the paper's)."""
    unknown = sorted(set(ops) - set(RAND_AUGMENT_OPS))
    if unknown:
        raise ConfigError(f"unknown RandAugment ops {unknown}: choose from {', '.join(RAND_AUGMENT_OPS)}")
    b, _, h, w = x.shape
    for _ in range(num_ops):
        choice = torch.randint(0, len(ops), (b,), generator=g)
        sign = torch.where(torch.rand(b, generator=g) < 0.5, -1.0, 1.0)
        m = _magnitudes(g, b, magnitude, magnitude_std) / 10.0
        out = x.clone()
        theta = None
        for k, name in enumerate(ops):
            sel = (choice == k).nonzero().flatten()
            if sel.numel() == 0:
                continue
            if name in GEOMETRIC_OPS:
                if theta is None:
                    theta = torch.zeros(b, 2, 3)
                    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
                theta[sel] = _affine_for(name, m[sel], sign[sel], h, w)
            else:
                out[sel] = _color_op(name, x[sel], m[sel], sign[sel])
        if theta is not None:
            geo = torch.tensor([ops[int(c)] in GEOMETRIC_OPS for c in range(len(ops))])[choice].nonzero().flatten()
            out[geo] = _warp(x[geo], theta[geo], fill)
        x = out if prob >= 1 else torch.where((torch.rand(b, generator=g) < prob).view(-1, 1, 1, 1), out, x)
    return x


# --- random erasing, Mixup, CutMix ----------------------------------------------------------
def random_erasing(x: Tensor, g: torch.Generator, p: float = 0.25, area: Tuple[float, float] = (0.02, 1 / 3),
                   ratio: Tuple[float, float] = (0.3, 3.3)) -> Tensor:
    """Replace a random rectangle of a random fraction ``p`` of the (normalised) images with N(0, 1) noise."""
    if p <= 0:
        return x
    b, c, h, w = x.shape
    apply = torch.rand(b, generator=g) < p
    a = _uniform(g, b, *area) * h * w
    r = torch.exp(_uniform(g, b, math.log(ratio[0]), math.log(ratio[1])))
    eh = torch.sqrt(a * r).round().clamp(1, h).long()
    ew = torch.sqrt(a / r).round().clamp(1, w).long()
    top = (torch.rand(b, generator=g) * (h - eh + 1)).long()
    left = (torch.rand(b, generator=g) * (w - ew + 1)).long()
    ys, xs = torch.arange(h)[None], torch.arange(w)[None]
    in_y = (ys >= top[:, None]) & (ys < (top + eh)[:, None])
    in_x = (xs >= left[:, None]) & (xs < (left + ew)[:, None])
    mask = (in_y[:, :, None] & in_x[:, None, :] & apply[:, None, None])[:, None]
    noise = torch.randn(x.shape, generator=g, dtype=x.dtype)
    return torch.where(mask, noise, x)


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    return F.one_hot(labels, num_classes).float()


@dataclass(frozen=True)
class MixDraw:
    """One batch's Mixup / CutMix draw: the Beta draw ``lam`` and, for CutMix, the box's centre (row,
    column); None for Mixup."""

    lam: float
    centre: Optional[Tuple[int, int]] = None


def draw_mix(g: torch.Generator, size: Tuple[int, int], mixup: float = 0.0, cutmix: float = 0.0,
             prob: float = 1.0, switch_prob: float = 0.5) -> Optional[MixDraw]:
    """The batch's draw (timm's ``Mixup`` in batch mode): with probability ``prob`` Mixup (Beta(``mixup``))
    or CutMix (Beta(``cutmix``); the one of the two with probability ``switch_prob`` when both are on); None:
    no mixing this batch."""
    rng = _seeded_rng(g)
    if (mixup <= 0 and cutmix <= 0) or rng.random() >= prob:
        return None
    use_cut = cutmix > 0 and (mixup <= 0 or rng.random() < switch_prob)
    alpha = cutmix if use_cut else mixup
    lam = rng.betavariate(alpha, alpha)
    return MixDraw(lam, (rng.randrange(size[0]), rng.randrange(size[1])) if use_cut else None)


def apply_mix(x: Tensor, targets: Tensor, d: MixDraw) -> Tuple[Tensor, Tensor]:
    """Mix each image and its target with the batch's reverse by the draw ``d``: Mixup blends them with
    weight ``lam``; CutMix pastes the reverse's box of side ``sqrt(1 - lam)`` (clipped at the border, as timm's
    ``rand_bbox``) and weighs the targets by the exact area kept."""
    lam, partner = d.lam, x.flip(0)
    if d.centre is not None:
        h, w = x.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = d.centre
        y0, y1 = max(cy - ch // 2, 0), min(cy + (ch + 1) // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + (cw + 1) // 2, w)
        x = x.clone()
        x[..., y0:y1, x0:x1] = partner[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / float(h * w)
    else:
        x = x * lam + partner * (1.0 - lam)
    return x, targets * lam + targets.flip(0) * (1.0 - lam)


def mix(x: Tensor, targets: Tensor, g: torch.Generator, mixup: float = 0.0, cutmix: float = 0.0,
        prob: float = 1.0, switch_prob: float = 0.5) -> Tuple[Tensor, Tensor]:
    """Mixup (alpha ``mixup``) or CutMix (alpha ``cutmix``) with the batch's reverse, one draw per batch
    (:func:`draw_mix`, :func:`apply_mix`).

    ``targets`` are one-hot / soft [B, K]; returns the mixed images and targets (CutMix's weight is the
    exact pasted area)."""
    d = draw_mix(g, tuple(x.shape[-2:]), mixup, cutmix, prob, switch_prob)
    return (x, targets) if d is None else apply_mix(x, targets, d)


# --- the pipelines -------------------------------------------------------------------------
@dataclass
class AugmentConfig:
    """What a recipe's ``augment`` section holds."""

    crop: str = "none"  # none | pad | inception | center
    pad: int = 4  # for crop=pad
    scale: Tuple[float, float] = (0.08, 1.0)  # for crop=inception
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    randaugment: Optional[Tuple[int, float]] = None  # (num_ops, magnitude out of 10), e.g. (2, 10)
    magnitude_std: float = 0.0  # per image and op: N(magnitude, std) clipped to [0, 10] (inf: U[0, magnitude])
    randaugment_prob: float = 1.0  # chance each drawn op is applied (timm's and DeiT's: 0.5; the paper's: 1)
    fill: float = 0.0  # value ([0, 1]) for pixels that geometric ops bring in
    mixup: float = 0.0  # Beta alpha; 0 = off
    cutmix: float = 0.0
    mix_prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0
    erasing: float = 0.0  # probability per image
    repeats: int = 1  # repeated augmentation (Hoffer et al. 2020 / DeiT): copies of each image per epoch

    def __post_init__(self) -> None:
        if self.crop is None:  # "none" on the command line parses to None
            self.crop = "none"
        if self.crop not in ("none", "pad", "inception", "center"):
            raise ConfigError(f"augment.crop={self.crop!r}: use none, pad, inception or center")
        if self.randaugment is not None:
            ra = tuple(self.randaugment)
            if len(ra) != 2 or ra[0] < 0 or not 0 <= ra[1] <= 10:
                raise ConfigError(f"augment.randaugment={self.randaugment!r}: give [num_ops, magnitude 0..10], "
                                  f"e.g. [2, 10], or null")
            self.randaugment = (int(ra[0]), float(ra[1]))
        if not self.magnitude_std >= 0:
            raise ConfigError(f"augment.magnitude_std must be >= 0 (inf: uniform magnitudes), got "
                              f"{self.magnitude_std}")
        for k in ("mix_prob", "switch_prob", "erasing", "randaugment_prob"):
            if not 0 <= getattr(self, k) <= 1:
                raise ConfigError(f"augment.{k} must be in [0, 1], got {getattr(self, k)}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"augment.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.repeats < 1:
            raise ConfigError(f"augment.repeats must be >= 1, got {self.repeats}")

    @property
    def mixes(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0


@dataclass
class Normalize:
    """(x - mean) / std per channel. ``channels``: what the model takes; grayscale batches are repeated to
    3 channels (and RGB turned to gray for a 1-channel model). One mean/std value serves every channel;
    3 values for a 1-channel model are averaged (the stored presets always carry 3)."""

    mean: Sequence[float] = (0.5,)
    std: Sequence[float] = (0.5,)
    channels: Optional[int] = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __call__(self, x: Tensor) -> Tensor:
        if self.channels == 3 and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif self.channels == 1 and x.shape[1] == 3:
            x = _gray(x)[:, :1]
        mean, inv_std = self._stats(x)
        return (x - mean) * inv_std

    def invert(self, x: Tensor) -> Tensor:
        """Back from normalised values to [0, 1] pixels (the channels stay as they are)."""
        mean, inv_std = self._stats(x)
        return x / inv_std + mean

    def _stats(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """(mean, 1 / std) as [1, C, 1, 1] tensors for the channel count, dtype and device of ``x``."""
        key = (x.shape[1], x.dtype, x.device)
        if key not in self._cache:
            c = x.shape[1]
            mean, std = [float(v) for v in self.mean], [float(v) for v in self.std]
            if len(mean) != len(std):
                raise ConfigError(f"normalisation has {len(mean)} means but {len(std)} stds")
            if c == 1 and len(mean) > 1:
                mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
            if len(mean) == 1:
                mean, std = mean * c, std * c
            if len(mean) != c:
                raise ConfigError(f"normalisation has {len(self.mean)} means for {c}-channel images: give one "
                                  f"value or one per channel")
            self._cache[key] = (torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, c, 1, 1),
                                1.0 / torch.tensor(std, dtype=x.dtype, device=x.device).view(1, c, 1, 1))
        return self._cache[key]


class BatchAugment:
    """uint8 batch + int labels -> normalised float images at ``size`` + targets (labels, or soft targets
    [B, K] when Mixup/CutMix is on). Label smoothing is applied by the loss."""

    def __init__(self, cfg: AugmentConfig, size: Tuple[int, int], num_classes: int, normalize: Normalize):
        self.cfg, self.size, self.num_classes, self.normalize = cfg, tuple(size), num_classes, normalize

    def __call__(self, images: Tensor, labels: Tensor, g: torch.Generator) -> Tuple[Tensor, Tensor]:
        c = self.cfg
        x = images
        if c.crop == "pad":
            x = pad_crop(x, c.pad, g, fill=int(round(c.fill * 255)) if x.dtype == torch.uint8 else c.fill)
        if c.flip and c.crop != "inception":
            x = flip(x, g)
        x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
        if c.crop == "inception":
            x = inception_crop(x, self.size, g, c.scale, c.ratio, hflip=0.5 if c.flip else 0.0)
        elif c.crop == "center":
            x = center_crop(x, self.size)
        x = resize(x, self.size)
        if c.randaugment is not None and c.randaugment[0] > 0:
            x = rand_augment(x, g, c.randaugment[0], c.randaugment[1], fill=c.fill, magnitude_std=c.magnitude_std,
                             prob=c.randaugment_prob)
        x = self.normalize(x)
        if c.erasing > 0:
            x = random_erasing(x, g, c.erasing)
        targets = labels
        if c.mixes:
            x, targets = mix(x, one_hot(labels, self.num_classes), g, c.mixup, c.cutmix, c.mix_prob, c.switch_prob)
        return x, targets


class EvalTransform:
    """The deterministic evaluation view: uint8 batch -> (centre crop of files loaded larger) -> resize ->
    normalise."""

    def __init__(self, size: Tuple[int, int], normalize: Normalize, center_crop_files: bool = False):
        self.size, self.normalize, self.center = tuple(size), normalize, center_crop_files

    def __call__(self, images: Tensor) -> Tensor:
        x = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
        if self.center and tuple(x.shape[-2:]) != self.size:
            x = center_crop(x, self.size if min(x.shape[-2:]) >= min(self.size) else x.shape[-2:])
        return self.normalize(resize(x, self.size))
