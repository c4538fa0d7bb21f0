"""Everything at once: ``analyze`` computes rollout, attention distance, position-embedding
similarity and embedding filters for a model and a set of images, and writes PNGs plus JSON."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..errors import InputError
from ..eval.features import prepare_images
from ..utils import PathLike, write_json_atomic
from .distance import mean_attention_distance, patch_distances
from .filters import embedding_filters
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
    from . import plots as P

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    cfg = model.config
    dev = next(model.parameters()).device
    if display is None:
        lo, hi = inputs.amin(dim=(1, 2, 3), keepdim=True), inputs.amax(dim=(1, 2, 3), keepdim=True)
        display = (inputs - lo) / (hi - lo).clamp_min(1e-12)
    names = list(names) if names is not None else [f"image {i}" for i in range(len(inputs))]
    label = title or cfg.name or f"ViT {cfg.width}x{cfg.depth}"
    summary: Dict[str, Any] = {"model": {"name": cfg.name, "img_size": list(cfg.img_size),
                                         "patch_size": list(cfg.patch_size), "width": cfg.width, "depth": cfg.depth,
                                         "num_heads": cfg.num_heads, "posemb": cfg.posemb, "pool": cfg.pool},
                               "files": {}}
    if extra:
        summary.update(extra)
    tensors: Dict[str, torch.Tensor] = {}

    # attention rollout (Figure 6)
    maps = torch.cat([rollout_maps(model, b.to(dev), head_fusion).cpu() for b in _batches(inputs, batch_size)])
    tensors["rollout"] = maps
    labels = model.meta.labels
    titles = list(names)
    if cfg.num_classes and labels:
        logits = torch.cat([model(b.to(dev)).cpu() for b in _batches(inputs, batch_size)])
        probs = logits.softmax(-1)
        top = probs.argmax(-1)
        preds = [{"image": n, "label": labels[int(t)], "prob": float(probs[i, t])}
                 for i, (n, t) in enumerate(zip(names, top))]
        summary["predictions"] = preds
        titles = [f"{n}\n{p['label']} {100 * p['prob']:.0f}%" for n, p in zip(names, preds)]
    peak = []
    for m in maps:
        idx = int(m.flatten().argmax())
        peak.append([idx // m.shape[1], idx % m.shape[1]])
    summary["rollout"] = {"head_fusion": head_fusion, "images": names, "peak_yx": peak}
    if plots:
        P.plot_rollout(display, normalize_maps(maps), out / "rollout.png", titles=titles,
                       suptitle=f"attention rollout ({head_fusion} over heads), {label}")
        summary["files"]["rollout"] = "rollout.png"

    # mean attention distance (Figure 7 right)
    dist_x = distance_inputs if distance_inputs is not None else inputs
    dist = mean_attention_distance(model, [b.to(dev) for b in _batches(dist_x, batch_size)], progress=progress).cpu()
    tensors["attention_distance"] = dist
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
    write_json_atomic(out / "attention_distance.json", dist_json)
    summary["attention_distance"] = {"mean_per_layer": per_layer.tolist(), "uniform_attention_px": uniform,
                                     "num_images": int(len(dist_x)), "file": "attention_distance.json", **extremes}
    if plots:
        P.plot_attention_distance(dist, out / "attention_distance.png", uniform=uniform,
                                  title=f"mean attention distance, {label} ({len(dist_x)} images)")
        summary["files"]["attention_distance"] = "attention_distance.png"

    # position-embedding similarity (Figure 7 centre)
    if cfg.posemb in ("learn", "learn2d", "sincos2d"):
        sim = posemb_similarity(model).cpu()
        tensors["posemb_similarity"] = sim
        near, far = near_far_similarity(sim)
        summary["posemb_similarity"] = {"grid": list(sim.shape[:2]), "neighbours": near, "far": far,
                                        "by_distance": similarity_by_distance(sim)}
        if plots:
            P.plot_posemb_similarity(sim, out / "posemb_similarity.png",
                                     title=f"position embedding similarity ({cfg.posemb}), {label}")
            summary["files"]["posemb_similarity"] = "posemb_similarity.png"
    else:
        summary["posemb_similarity"] = {"skipped": f"posemb={cfg.posemb!r} has no additive position table"}

    # embedding filters (Figure 7 left)
    if cfg.backbone:
        summary["embedding_filters"] = {"skipped": "hybrid: the embedding projects ResNet features, not pixels"}
    else:
        comps, ratio = embedding_filters(model, num_filters)
        tensors["filters"] = comps
        summary["embedding_filters"] = {"components": int(len(comps)), "explained_variance": ratio.tolist()}
        if plots:
            P.plot_filters(comps, out / "embedding_filters.png", explained=ratio)
            summary["files"]["embedding_filters"] = "embedding_filters.png"

    write_json_atomic(out / "summary.json", summary)
    summary["tensors"] = tensors
    return summary
