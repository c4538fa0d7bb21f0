"""Masked patch prediction (Section 4.6, Appendix B.1.2): BERT-style self-supervision for ViT.

Half of the patch embeddings (after the linear projection E, before the
position embeddings) are corrupted: of those, 80% are replaced by a learnable
[mask] embedding, 10% by the embedding of another random patch of the batch
and 10% are kept as they are. From each corrupted patch's final
representation the model predicts one of the paper's targets:

- ``mean_color``: the patch's mean colour, 3 bits per channel (512 classes for RGB);
- ``color4x4``: the patch downsampled to 4x4, each cell's 3-bit colour (16 predictions of 512 classes);
- ``pixels``: L2 regression on the full patch (P * P * C values in [0, 1]).

The loss is computed on the corrupted patches only (the kept 10% included).
Targets come from the images in [0, 1]: the model's input is de-normalised
with ``pixel_mean`` / ``pixel_std``.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError

MPP_TARGETS = ("mean_color", "color4x4", "pixels")
NONE, MASKED, RANDOM, KEPT = 0, 1, 2, 3  # corruption kinds


def quantize(values: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """Values in [0, 1] -> integer levels 0 .. 2**bits - 1 (equal-width bins, 1.0 in the top bin)."""
    levels = 2 ** bits
    return (values * levels).floor().clamp_(0, levels - 1).long()


def color_classes(colors: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """Colours [..., C] in [0, 1] -> one class per colour: the channels' levels as digits (first channel
    most significant), so RGB with 3 bits gives 512 classes."""
    q = quantize(colors, bits)
    levels, out = 2 ** bits, torch.zeros_like(q[..., 0])
    for c in range(q.shape[-1]):
        out = out * levels + q[..., c]
    return out


def class_colors(classes: torch.Tensor, channels: int, bits: int = 3) -> torch.Tensor:
    """Inverse of :func:`color_classes`: class indices -> the centres of their colour bins [..., C]."""
    levels = 2 ** bits
    digits = []
    rest = classes.long()
    for _ in range(channels):
        digits.append(rest % levels)
        rest = rest // levels
    q = torch.stack(digits[::-1], dim=-1)
    return (q.float() + 0.5) / levels


def patchify(images: torch.Tensor, patch: Tuple[int, int]) -> torch.Tensor:
    """[B, C, H, W] -> [B, N, C, ph, pw], patches in row-major order (the token order of the ViT)."""
    b, c, h, w = images.shape
    ph, pw = patch
    if h % ph or w % pw:
        raise InputError(f"images {h}x{w} are not divisible by the {ph}x{pw} pixel patches of the model: resize them")
    x = images.reshape(b, c, h // ph, ph, w // pw, pw).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // ph) * (w // pw), c, ph, pw)


def mpp_targets(images: torch.Tensor, patch: Tuple[int, int], target: str = "mean_color",
                bits: int = 3) -> torch.Tensor:
    """Per-patch targets from images in [0, 1]: classes [B, N] (mean_color), classes [B, N, 16]
    (color4x4, cells in row-major order) or values [B, N, C * ph * pw] (pixels)."""
    p = patchify(images, patch)
    b, n, c, ph, pw = p.shape
    if target == "mean_color":
        return color_classes(p.mean(dim=(-2, -1)), bits)
    if target == "color4x4":
        if ph % 4 or pw % 4:
            raise ConfigError(f"the color4x4 target needs pixel patches divisible by 4, got {ph}x{pw}: "
                              f"use target='mean_color' or 'pixels'")
        cells = F.avg_pool2d(p.reshape(b * n, c, ph, pw), (ph // 4, pw // 4))  # [B*N, C, 4, 4]
        return color_classes(cells.reshape(b, n, c, 16).transpose(-1, -2), bits)
    if target == "pixels":
        return p.reshape(b, n, c * ph * pw)
    raise ConfigError(f"target={target!r} is not one of {', '.join(MPP_TARGETS)}")


def corrupt(tokens: torch.Tensor, mask_embedding: torch.Tensor, ratio: float = 0.5, p_mask: float = 0.8,
            p_random: float = 0.1, generator: Optional[torch.Generator] = None, return_source: bool = False):
    """Corrupt patch embeddings [B, N, D] (BERT-style): round(ratio * N) patches of every image are chosen;
    each is replaced by ``mask_embedding`` (prob. p_mask), by another random patch's embedding from the batch
    (p_random) or kept. Returns (corrupted tokens, kind [B, N] with NONE / MASKED / RANDOM / KEPT), and with
    ``return_source`` also the flat batch index (b * N + n) of each RANDOM patch's replacement (-1 elsewhere)."""
    if not 0.0 < ratio <= 1.0 or p_mask < 0 or p_random < 0 or p_mask + p_random > 1.0:
        raise ConfigError(f"need 0 < ratio <= 1 and p_mask + p_random <= 1, got ratio={ratio}, "
                          f"p_mask={p_mask}, p_random={p_random}")
    b, n, d = tokens.shape
    dev = tokens.device
    k = max(1, round(ratio * n))
    order = torch.rand(b, n, generator=generator, device=dev).argsort(dim=1)
    chosen = torch.zeros(b, n, dtype=torch.bool, device=dev).scatter_(1, order[:, :k], True)
    u = torch.rand(b, n, generator=generator, device=dev)
    kind = torch.full((b, n), NONE, dtype=torch.long, device=dev)
    kind[chosen & (u < p_mask)] = MASKED
    kind[chosen & (u >= p_mask) & (u < p_mask + p_random)] = RANDOM
    kind[chosen & (u >= p_mask + p_random)] = KEPT
    flat = tokens.reshape(b * n, d)
    # another patch: uniform over the other b*n - 1 patches of the batch
    other = torch.randint(0, max(b * n - 1, 1), (b * n,), generator=generator, device=dev)
    other = other + (other >= torch.arange(b * n, device=dev)).long() if b * n > 1 else other
    out = torch.where((kind == MASKED)[..., None], mask_embedding.to(tokens.dtype).reshape(1, 1, d), tokens)
    out = torch.where((kind == RANDOM)[..., None], flat[other].reshape(b, n, d), out)
    if return_source:
        return out, kind, torch.where(kind == RANDOM, other.reshape(b, n), torch.full_like(other.reshape(b, n), -1))
    return out, kind


class MaskedPatchPrediction(nn.Module):
    """A ViT with a learnable [mask] embedding and a linear prediction head on its patch tokens.

    ``forward(x)`` corrupts, encodes and returns a dict with ``loss`` (on corrupted patches only),
    ``prediction`` (head outputs for every patch), ``target``, ``kind`` (corruption per patch).
    """

    def __init__(self, vit: nn.Module, target: str = "mean_color", *, bits: int = 3, ratio: float = 0.5,
                 p_mask: float = 0.8, p_random: float = 0.1,
                 pixel_mean: Union[float, Sequence[float]] = 0.5, pixel_std: Union[float, Sequence[float]] = 0.5):
        super().__init__()
        if target not in MPP_TARGETS:
            raise ConfigError(f"target={target!r} is not one of {', '.join(MPP_TARGETS)}")
        cfg = vit.config
        self.vit = vit
        self.target, self.bits = target, bits
        self.ratio, self.p_mask, self.p_random = ratio, p_mask, p_random
        self.patch = cfg.pixel_patch_size
        c = cfg.in_chans
        self.num_colors = (2 ** bits) ** c
        self.outputs = {"mean_color": self.num_colors, "color4x4": 16 * self.num_colors,
                        "pixels": c * self.patch[0] * self.patch[1]}[target]
        self.mask_token = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.mpp_head = nn.Linear(cfg.width, self.outputs)
        self.register_buffer("pixel_mean", _channels(pixel_mean, c), persistent=False)
        self.register_buffer("pixel_std", _channels(pixel_std, c), persistent=False)
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.mpp_head.weight, std=0.02)
        nn.init.zeros_(self.mpp_head.bias)

    def pixels(self, x: torch.Tensor) -> torch.Tensor:
        """The model input de-normalised to [0, 1]."""
        return (x * self.pixel_std + self.pixel_mean).clamp(0.0, 1.0)

    def forward(self, x: torch.Tensor, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        vit = self.vit
        tokens, grid = vit.embed(x)
        prefix = vit.config.num_prefix_tokens
        patches, kind, source = corrupt(tokens[:, prefix:], self.mask_token, self.ratio, self.p_mask,
                                        self.p_random, generator, return_source=True)
        feats = vit.forward_tokens(torch.cat([tokens[:, :prefix], patches], dim=1), grid)[:, prefix:]
        pred = self.mpp_head(feats)
        with torch.no_grad():
            target = mpp_targets(self.pixels(x), self.patch, self.target, self.bits)
            corrupted = kind != NONE
            hits = None
            if self.target != "pixels":  # accuracy of the predicted class on corrupted patches
                guess = pred.detach().reshape(*target.shape, -1).argmax(-1)
                hits = (guess == target).float().reshape(*kind.shape, -1).mean(-1)[corrupted].sum()
        return {"loss": mpp_loss(pred, target, corrupted, self.target, self.num_colors),
                "prediction": pred, "target": target, "kind": kind, "source": source,
                "correct": hits, "count": corrupted.sum()}

    def predict_colors(self, x: torch.Tensor, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        """For a figure: per-patch mean colours of the input, of the predictions and the corruption kinds.
        Colours are [B, N, C] in [0, 1]."""
        out = self.forward(x, generator)
        c = self.vit.config.in_chans
        true = patchify(self.pixels(x), self.patch).mean(dim=(-2, -1))
        pred = out["prediction"].float()
        if self.target == "mean_color":
            guess = class_colors(pred.argmax(-1), c, self.bits)
        elif self.target == "color4x4":
            b, n = pred.shape[:2]
            guess = class_colors(pred.reshape(b, n, 16, -1).argmax(-1), c, self.bits).mean(dim=2)
        else:
            guess = pred.reshape(*pred.shape[:2], c, -1).mean(-1).clamp(0, 1)
        return {"true": true, "predicted": guess, "kind": out["kind"], "source": out["source"], "loss": out["loss"]}

    def no_weight_decay(self) -> set:
        """The ViT's no-decay set, the mask embedding and every bias / 1-D parameter."""
        inner = {f"vit.{n}" for n in self.vit.no_weight_decay()} if hasattr(self.vit, "no_weight_decay") else set()
        return inner | {n for n, p in self.named_parameters() if p.ndim <= 1 or n == "mask_token"}


def mpp_loss(pred: torch.Tensor, target: torch.Tensor, corrupted: torch.Tensor, kind: str,
             num_colors: int) -> torch.Tensor:
    """Mean loss over corrupted patches only: cross-entropy (mean_color, color4x4: over its 16 cells too)
    or mean squared error per value (pixels)."""
    p, t = pred[corrupted].float(), target[corrupted]
    if kind == "mean_color":
        return F.cross_entropy(p, t)
    if kind == "color4x4":
        return F.cross_entropy(p.reshape(-1, num_colors), t.reshape(-1))
    return F.mse_loss(p, t.to(p.dtype))


def _channels(v: Union[float, Sequence[float]], c: int) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float32).flatten()
    if c == 1 and t.numel() > 1:  # one grey channel: the mean of the given values (as Normalize does)
        t = t.mean().reshape(1)
    if t.numel() == 1:
        t = t.expand(c)
    if t.numel() != c:
        raise InputError(f"pixel mean/std has {t.numel()} values for a {c}-channel model")
    return t.reshape(1, c, 1, 1).clone()
