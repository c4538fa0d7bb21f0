"""PNG figures for the analysis and few-shot results (matplotlib, an optional dependency).

matplotlib is imported only when a figure is drawn; without it the drawing
functions raise :class:`~vitkit.errors.MissingDependency` saying how to install it.
Figures are built with ``matplotlib.figure.Figure`` (no pyplot global state,
no display needed) and written atomically.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..errors import InputError, MissingDependency
from ..utils import PathLike, atomic_path


def matplotlib_figure():
    """(matplotlib, its Figure class), imported on first use; :class:`~vitkit.errors.MissingDependency`
    naming the ``plots`` extra when matplotlib is not installed."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("drawing figures needs matplotlib, which is not installed", extra="plots") from None
    return matplotlib, Figure


def colorize(values: np.ndarray, cmap: str = "jet") -> np.ndarray:
    """Map values in [0, 1] to RGB [..., 3] floats with a matplotlib colormap."""
    matplotlib, _ = matplotlib_figure()
    return np.asarray(matplotlib.colormaps[cmap](np.clip(values, 0.0, 1.0)))[..., :3]


def save_figure(fig, path: PathLike, dpi: int = 120) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")


def _to_hwc(image: torch.Tensor) -> np.ndarray:
    """[C, H, W] in [0, 1] -> [H, W, 3] for display (gray repeated)."""
    img = torch.as_tensor(image).detach().float().clamp(0, 1).cpu()
    if img.ndim == 2:
        img = img[None]
    if img.shape[0] == 1:
        img = img.expand(3, -1, -1)
    return img[:3].permute(1, 2, 0).numpy()


def overlay(image: torch.Tensor, heat: torch.Tensor, cmap: str = "jet", alpha: float = 0.5) -> np.ndarray:
    """An image [C, H, W] in [0, 1] with a heat map [H, W] in [0, 1] blended over it: [H, W, 3]."""
    img = _to_hwc(image)
    h = torch.as_tensor(heat).detach().float().cpu().numpy()
    if h.shape != img.shape[:2]:
        raise InputError(f"heat map {h.shape} and image {img.shape[:2]} differ in size")
    return (1.0 - alpha) * img + alpha * colorize(h, cmap)


def plot_rollout(images: torch.Tensor, maps: torch.Tensor, path: PathLike, *, titles: Optional[Sequence[str]] = None,
                 ncols: int = 4, cmap: str = "jet", alpha: float = 0.5, suptitle: Optional[str] = None) -> None:
    """A grid of (input, rollout overlay) pairs, as in Figure 6. ``maps`` [B, H, W] already in [0, 1]."""
    _, Figure = matplotlib_figure()
    b = len(images)
    if len(maps) != b:
        raise InputError(f"{b} images but {len(maps)} maps")
    ncols = max(1, min(ncols, b))
    nrows = math.ceil(b / ncols)
    fig = Figure(figsize=(2 * 2.1 * ncols, 2.3 * nrows + 0.4), constrained_layout=True)
    for i in range(b):
        r, c = divmod(i, ncols)
        for j, panel in enumerate((_to_hwc(images[i]), overlay(images[i], maps[i], cmap, alpha))):
            ax = fig.add_subplot(nrows, 2 * ncols, r * 2 * ncols + 2 * c + j + 1)
            ax.imshow(panel, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0 and titles is not None:
                ax.set_title(str(titles[i]), fontsize=8)
            if j == 1:
                ax.set_title("attention rollout", fontsize=8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    save_figure(fig, path)


def plot_attention_distance(distance: torch.Tensor, path: PathLike, *, uniform: Optional[float] = None,
                            title: Optional[str] = None) -> None:
    """Figure 7 (right): layer on the x-axis, one dot per head, mean attention distance in pixels."""
    matplotlib, Figure = matplotlib_figure()
    d = torch.as_tensor(distance).detach().float().cpu().numpy()
    layers, heads = d.shape
    fig = Figure(figsize=(5.0, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    colors = matplotlib.colormaps["tab20" if heads > 10 else "tab10"]
    for h in range(heads):
        ax.scatter(np.arange(1, layers + 1), d[:, h], s=18, color=colors(h % colors.N), label=f"head {h + 1}")
    ax.plot(np.arange(1, layers + 1), d.mean(axis=1), color="black", lw=1, alpha=0.6, label="mean over heads")
    if uniform is not None:
        ax.axhline(uniform, color="gray", ls="--", lw=1, label="uniform attention")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(np.arange(1, layers + 1))
    top = max(float(d.max()), uniform or 0.0)
    ax.set_ylim(0, top * 1.1 + 1e-6)
    ax.legend(fontsize=6, ncol=2 if heads > 6 else 1, loc="lower right")
    ax.set_title(title or "mean attention distance", fontsize=10)
    save_figure(fig, path)


def posemb_mosaic(sim: torch.Tensor, gap: int = 1) -> np.ndarray:
    """Lay the [rows, cols, rows, cols] maps out as one image; the gaps between tiles are NaN."""
    s = torch.as_tensor(sim).detach().float().cpu().numpy()
    gh, gw = s.shape[:2]
    out = np.full((gh * (gh + gap) - gap, gw * (gw + gap) - gap), np.nan)
    for r in range(gh):
        for c in range(gw):
            y, x = r * (gh + gap), c * (gw + gap)
            out[y:y + gh, x:x + gw] = s[r, c]
    return out


def plot_posemb_similarity(sim: torch.Tensor, path: PathLike, *, title: Optional[str] = None,
                           cmap: str = "viridis") -> None:
    """Figure 7 (centre): tile (r, c) is the cosine similarity of patch (r, c)'s position embedding
    with every other patch's."""
    _, Figure = matplotlib_figure()
    gh, gw = sim.shape[:2]
    mosaic = posemb_mosaic(sim)
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(np.ma.masked_invalid(mosaic), cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in range(gw)])
    ax.set_xticklabels([str(c + 1) for c in range(gw)], fontsize=6)
    ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in range(gh)])
    ax.set_yticklabels([str(r + 1) for r in range(gh)], fontsize=6)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(im, ax=ax, label="cosine similarity", fraction=0.046, pad=0.04)
    ax.set_title(title or "position embedding similarity", fontsize=10)
    save_figure(fig, path)


def plot_filters(components: torch.Tensor, path: PathLike, *, ncols: int = 7,
                 explained: Optional[torch.Tensor] = None, title: Optional[str] = None) -> None:
    """Figure 7 (left): principal components of the patch embedding as C x P x P patches, each rescaled
    to [0, 1] by its own range."""
    _, Figure = matplotlib_figure()
    comps = torch.as_tensor(components).detach().float().cpu()
    k = comps.shape[0]
    ncols = max(1, min(ncols, k))
    nrows = math.ceil(k / ncols)
    fig = Figure(figsize=(1.1 * ncols, 1.2 * nrows + 0.4), constrained_layout=True)
    for i in range(k):
        c = comps[i]
        c = (c - c.min()) / (c.max() - c.min()).clamp_min(1e-12)
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.imshow(_to_hwc(c), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if explained is not None:
            ax.set_title(f"{100 * float(explained[i]):.1f}%", fontsize=6)
    kind = {3: "RGB", 1: "grayscale"}.get(comps.shape[1], f"{comps.shape[1]}-channel")
    fig.suptitle(title or f"{kind} embedding filters (first {k} principal components)", fontsize=9)
    save_figure(fig, path)


def plot_fewshot(results: Dict[str, Dict[str, Any]], path: PathLike, *, title: Optional[str] = None) -> None:
    """Few-shot accuracy against shots per class (mean and spread over seeds), one line per model;
    the linear probe on all training data, when present, as a dashed line."""
    matplotlib, Figure = matplotlib_figure()
    fig = Figure(figsize=(5.0, 3.8))
    ax = fig.add_subplot(1, 1, 1)
    colors = matplotlib.colormaps["tab10"]
    for i, (name, res) in enumerate(results.items()):
        rows: List[Dict[str, Any]] = res.get("fewshot", [])
        color = colors(i % 10)
        if rows:
            ks = [r["shots"] for r in rows]
            ax.errorbar(ks, [100 * r["mean"] for r in rows], yerr=[100 * r["std"] for r in rows], marker="o",
                        capsize=3, color=color, label=f"{name} (few-shot)")
        probe = res.get("linear_probe")
        if probe:
            ax.axhline(100 * probe["accuracy"], color=color, ls="--", lw=1, label=f"{name} (all data)")
    ax.set_xscale("log")
    ax.set_xlabel("training examples per class")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=7)
    ax.set_title(title or "linear few-shot evaluation", fontsize=10)
    save_figure(fig, path)
