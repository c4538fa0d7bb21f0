"""Everything at once: ``analyze`` computes rollout, attention distance, position-embedding
similarity and embedding filters for a model and a set of images, and writes PNGs plus JSON."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import InputError
from ..eval.features import prepare_images
from ..utils import PathLike, write_json_atomic
from .distance import mean_attention_distance, patch_distances
from .filters import embedding_filters
from .plots import plot_attention_distance, plot_filters, plot_posemb_similarity, plot_rollout
from .posemb_similarity import near_far_similarity, posemb_similarity, similarity_by_distance
from .rollout import normalize_maps, rollout_maps


def load_images(sources: Sequence[Union[PathLike, Any]], model: torch.nn.Module
                ) -> Tuple[torch.Tensor, torch.Tensor, List[str]]:
    """Image files (or PIL images) -> (display [B, C, H, W] in [0, 1], model inputs [B, C, H, W], names).

    The model's own preprocessing decides the pixels that reach it: a preset
    record (``resize_mode`` etc., as checkpoints from other libraries carry)
    is applied exactly; otherwise the image is resized to the model size and
    normalised with the record's mean/std (default 0.5). Images are converted
    to the model's channel count; ``display`` shows exactly what it sees.
    """
    from ..data.preprocess import Preset, get_preset, load_image

    cfg = model.config
    pre = model.meta.preprocessing or {}
    preset: Optional[Preset] = None
    if "resize_mode" in pre:
        preset = get_preset(pre, cfg.img_size)
    shown, inputs, names = [], [], []
    for src in sources:
        name = Path(str(src)).name if not hasattr(src, "size") else f"image {len(names)}"
        img = load_image(src)
        if preset is not None:
            pixels = preset.crop(img)  # [3, H, W] in 0..255, exactly what the preset feeds the model
        else:
            img = img.resize((cfg.img_size[1], cfg.img_size[0]), resample=2)  # PIL bilinear (antialiased)
            import numpy as np
            pixels = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float()
        x = prepare_images(pixels[None] / 255.0, cfg.img_size, cfg.in_chans,
                           {"mean": pre.get("mean", [0.5]), "std": pre.get("std", [0.5])})
        disp = pixels / 255.0
        if cfg.in_chans == 1:
            disp = disp.mean(dim=0, keepdim=True)
        shown.append(disp)
        inputs.append(x[0])
        names.append(name)
    if not inputs:
        raise InputError("no images given")
    return torch.stack(shown), torch.stack(inputs), names


def _batches(x: torch.Tensor, size: int):
    return [x[i:i + size] for i in range(0, len(x), size)]


@dataclass
class _Run:
    """Where one :func:`analyze` call writes: its folder, whether it plots, the model's name in the figure
    titles, and the summary and tensors each analysis adds to."""

    out: Path
    plots: bool
    label: str
    summary: Dict[str, Any]
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict)

    def plotted(self, key: str, filename: str) -> Path:
        """The path of figure ``filename``, listed in the summary's files under ``key``."""
        self.summary["files"][key] = filename
        return self.out / filename


@torch.no_grad()
def analyze(model: torch.nn.Module, inputs: torch.Tensor, out_dir: PathLike, *,
            display: Optional[torch.Tensor] = None, names: Optional[Sequence[str]] = None,
            distance_inputs: Optional[torch.Tensor] = None, head_fusion: str = "mean", num_filters: int = 28,
            batch_size: int = 32, plots: bool = True, progress: bool = True,
            title: Optional[str] = None, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run every analysis and write ``rollout.png``, ``attention_distance.png|json``,
    ``posemb_similarity.png``, ``embedding_filters.png`` and ``summary.json`` into ``out_dir``.

    ``inputs``: model inputs [B, C, H, W] for the rollout grid (``display``:
    the same images in [0, 1] for the overlay; by default the inputs rescaled).
    ``distance_inputs``: the images the attention distance is averaged over
    (default: ``inputs``). Returns the summary (also the tensors under
    ``"tensors"``, which are not written to JSON).
    """
    if plots:
        from .plots import matplotlib_figure
        matplotlib_figure()  # fail now, before the work, when matplotlib is missing

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    cfg = model.config
    if display is None:
        lo, hi = inputs.amin(dim=(1, 2, 3), keepdim=True), inputs.amax(dim=(1, 2, 3), keepdim=True)
        display = (inputs - lo) / (hi - lo).clamp_min(1e-12)
    names = list(names) if names is not None else [f"image {i}" for i in range(len(inputs))]
    summary: Dict[str, Any] = {"model": {"name": cfg.name, "img_size": list(cfg.img_size),
                                         "patch_size": list(cfg.patch_size), "width": cfg.width, "depth": cfg.depth,
                                         "num_heads": cfg.num_heads, "posemb": cfg.posemb, "pool": cfg.pool},
                               "files": {}}
    if extra:
        summary.update(extra)
    run = _Run(out, plots, title or cfg.name or f"ViT {cfg.width}x{cfg.depth}", summary)
    _rollout(run, model, inputs, display, names, head_fusion, batch_size)
    _attention_distance(run, model, distance_inputs if distance_inputs is not None else inputs, batch_size, progress)
    _posemb_similarity(run, model)
    _embedding_filters(run, model, num_filters)
    write_json_atomic(out / "summary.json", summary)
    summary["tensors"] = run.tensors
    return summary


def _rollout(run: _Run, model: torch.nn.Module, inputs: torch.Tensor, display: torch.Tensor, names: List[str],
             head_fusion: str, batch_size: int) -> None:
    """Attention rollout (Figure 6), with the model's predictions in the titles when it has labels."""
    cfg, dev = model.config, next(model.parameters()).device
    maps = torch.cat([rollout_maps(model, b.to(dev), head_fusion).cpu() for b in _batches(inputs, batch_size)])
    run.tensors["rollout"] = maps
    labels = model.meta.labels
    titles = list(names)
    if cfg.num_classes and labels:
        logits = torch.cat([model(b.to(dev)).cpu() for b in _batches(inputs, batch_size)])
        probs = logits.softmax(-1)
        top = probs.argmax(-1)
        preds = [{"image": n, "label": labels[int(t)], "prob": float(probs[i, t])}
                 for i, (n, t) in enumerate(zip(names, top))]
        run.summary["predictions"] = preds
        titles = [f"{n}\n{p['label']} {100 * p['prob']:.0f}%" for n, p in zip(names, preds)]
    peak = []
    for m in maps:
        idx = int(m.flatten().argmax())
        peak.append([idx // m.shape[1], idx % m.shape[1]])
    run.summary["rollout"] = {"head_fusion": head_fusion, "images": names, "peak_yx": peak}
    if run.plots:
        plot_rollout(display, normalize_maps(maps), run.plotted("rollout", "rollout.png"), titles=titles,
                     suptitle=f"attention rollout ({head_fusion} over heads), {run.label}")


def _attention_distance(run: _Run, model: torch.nn.Module, dist_x: torch.Tensor, batch_size: int,
                        progress: bool) -> None:
    """Mean attention distance per layer and head over ``dist_x`` (Figure 7 right), also as its own JSON."""
    cfg, dev = model.config, next(model.parameters()).device
    dist = mean_attention_distance(model, [b.to(dev) for b in _batches(dist_x, batch_size)], progress=progress).cpu()
    run.tensors["attention_distance"] = dist
    grid = cfg.grid_size if tuple(dist_x.shape[-2:]) == cfg.img_size else (
        math.ceil(dist_x.shape[-2] / cfg.pixel_patch_size[0]), math.ceil(dist_x.shape[-1] / cfg.pixel_patch_size[1]))
    uniform = float(patch_distances(grid, cfg.pixel_patch_size).mean())
    per_layer = dist.mean(dim=1)
    dist_json = {"distance_px": dist.tolist(), "mean_per_layer": per_layer.tolist(), "uniform_attention_px": uniform,
                 "num_images": int(len(dist_x)), "image_size": list(dist_x.shape[-2:]),
                 "patch_size": list(cfg.pixel_patch_size),
                 "definition": "attention-weighted mean pixel distance between query and key patch centres "
                               "(class token left out, weights renormalised over patches), averaged over query "
                               "patches and images; [layer][head]"}
    heads = dist.shape[1]
    lo, hi = int(dist.argmin()), int(dist.argmax())  # the most and least local heads, 1-based like the paper's plots
    extremes = {"most_local_head": {"layer": lo // heads + 1, "head": lo % heads + 1, "distance_px": float(dist.min())},
                "least_local_head": {"layer": hi // heads + 1, "head": hi % heads + 1,
                                     "distance_px": float(dist.max())}}
    dist_json.update(extremes)
    write_json_atomic(run.out / "attention_distance.json", dist_json)
    run.summary["attention_distance"] = {"mean_per_layer": per_layer.tolist(), "uniform_attention_px": uniform,
                                         "num_images": int(len(dist_x)), "file": "attention_distance.json",
                                         **extremes}
    if run.plots:
        plot_attention_distance(dist, run.plotted("attention_distance", "attention_distance.png"), uniform=uniform,
                                title=f"mean attention distance, {run.label} ({len(dist_x)} images)")


def _posemb_similarity(run: _Run, model: torch.nn.Module) -> None:
    """Cosine similarity of the position embeddings (Figure 7 centre), when the model adds a table."""
    cfg = model.config
    if cfg.posemb not in ("learn", "learn2d", "sincos2d"):
        run.summary["posemb_similarity"] = {"skipped": f"posemb={cfg.posemb!r} has no additive position table"}
        return
    sim = posemb_similarity(model).cpu()
    run.tensors["posemb_similarity"] = sim
    near, far = near_far_similarity(sim)
    run.summary["posemb_similarity"] = {"grid": list(sim.shape[:2]), "neighbours": near, "far": far,
                                        "by_distance": similarity_by_distance(sim)}
    if run.plots:
        plot_posemb_similarity(sim, run.plotted("posemb_similarity", "posemb_similarity.png"),
                               title=f"position embedding similarity ({cfg.posemb}), {run.label}")


def _embedding_filters(run: _Run, model: torch.nn.Module, num_filters: int) -> None:
    """The principal components of the patch embedding's filters (Figure 7 left); not for hybrids."""
    if model.config.backbone:
        run.summary["embedding_filters"] = {"skipped": "hybrid: the embedding projects ResNet features, not pixels"}
        return
    comps, ratio = embedding_filters(model, num_filters)
    run.tensors["filters"] = comps
    run.summary["embedding_filters"] = {"components": int(len(comps)), "explained_variance": ratio.tolist()}
    if run.plots:
        plot_filters(comps, run.plotted("embedding_filters", "embedding_filters.png"), explained=ratio)
