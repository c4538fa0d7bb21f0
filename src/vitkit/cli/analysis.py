"""Evaluation and analysis commands: ``fewshot`` (frozen linear probe) and ``analyze`` (look inside)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..errors import DataError, UsageError, require
from ._util import ManyFiles, nonneg_float, nonneg_int, positive_int

DEFAULT_CACHE = "~/.cache/vitkit/features"


def register(sub) -> None:
    p = sub.add_parser(
        "fewshot", help="few-shot linear evaluation of frozen features (Section 4.1), and the linear probe",
        description="Closed-form regularised least squares onto {-1,1}^K targets, on frozen features of k "
                    "training images per class (several k and seeds; the L2 strength is chosen on validation "
                    "images held out of the training set). Features are cached on disk.")
    p.add_argument("checkpoints", nargs="*", metavar="CHECKPOINT", help="checkpoints (any format vitkit reads)")
    p.add_argument("--pixels", action="store_true", help="also evaluate raw pixels (a baseline without a model)")
    p.add_argument("--data", default="fashion-mnist",
                   help="dataset with train and test splits: fashion-mnist[:DIR], mnist[:DIR], cifar10:DIR, "
                        "cifar100:DIR, folder:DIR (DIR/{train,test}/<class>/*.jpg), tensors:FILE "
                        "(default: fashion-mnist from /usr/share/datasets)")
    p.add_argument("--load-size", type=positive_int, default=None,
                   help="size image folders are decoded at before the model's resize (default: the model size)")
    p.add_argument("--img-size", type=positive_int, nargs="+", metavar="N",
                   help="evaluate at another resolution: N or H W (position embeddings resized; e.g. 224 for "
                        "DINOv2's 518 px weights)")
    p.add_argument("--shots", type=positive_int, nargs="*", default=[1, 5, 10, 25], metavar="K",
                   help="examples per class (default: 1 5 10 25; none: only the linear probe)")
    p.add_argument("--seeds", type=positive_int, default=5, help="repetitions with different shots (default 5)")
    p.add_argument("--representation", default="pre_logits", choices=["pre_logits", "token", "gap"],
                   help="pre_logits (what the head sees; default), token (final class token) or gap "
                        "(mean of the final patch tokens)")
    p.add_argument("--l2", type=nonneg_float, nargs="+", metavar="L2",
                   help="L2 strengths to choose from (default: 2^-10 ... 2^19)")
    p.add_argument("--val-per-class", type=positive_int, default=20,
                   help="validation images per class for choosing the L2 strength (default 20)")
    p.add_argument("--linear-probe", action="store_true", help="also fit the probe on all training images")
    p.add_argument("--train-limit", type=positive_int, help="use only the first N training images")
    p.add_argument("--test-limit", type=positive_int, help="use only the first N test images")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps ... (default cpu)")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE, help=f"feature cache (default {DEFAULT_CACHE})")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the feature cache")
    p.add_argument("--out", help="folder for fewshot.json and fewshot.png")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_fewshot)

    p = sub.add_parser(
        "analyze", help="attention rollout, attention distance, position-embedding similarity and "
                        "embedding filters of a checkpoint, as PNGs and JSON",
        description="Writes rollout.png (Figure 6), attention_distance.png/.json (Figure 7 right), "
                    "posemb_similarity.png (Figure 7 centre), embedding_filters.png (Figure 7 left) and "
                    "summary.json into --out. Needs the plots extra: pip install 'vitkit[plots]'.")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint (any format vitkit reads)")
    p.add_argument("images", nargs="*", metavar="IMAGE", help="image files or folders for the rollout grid "
                   "(and the attention distance, unless --data is given)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--data", help="also take images from a dataset's test split: fashion-mnist[:DIR], mnist, "
                   "cifar10:DIR, folder:DIR, ... (as vitkit train reads them)")
    p.add_argument("--num-images", type=positive_int, default=128,
                   help="dataset images the attention distance is averaged over (default 128, as the paper)")
    p.add_argument("--rollout-images", type=nonneg_int, default=10,
                   help="dataset images in the rollout grid (one per class first; default 10)")
    p.add_argument("--head-fusion", default="mean", choices=["mean", "max", "min"])
    p.add_argument("--img-size", type=positive_int, nargs="+", metavar="N",
                   help="analyse at another resolution: N or H W (position embeddings resized)")
    p.add_argument("--filters", type=positive_int, default=28,
                   help="principal components of the embedding (default 28)")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--title", help="model name shown in the figures")
    p.set_defaults(func=_analyze)


# --- helpers ---------------------------------------------------------------------
def load_checkpoint(path: str, img_size=None, device: str = "cpu"):
    """A model from any checkpoint vitkit reads (``load_weights``), optionally rebuilt for another input size."""
    from ..checkpoints import load_weights

    model = load_weights(path, **({"img_size": tuple(img_size)} if img_size is not None else {}))
    return model.to(device).eval()


def load_split(spec: str, split: str, channels: int = 3, load_size: int = 256,
               classes: Optional[List[str]] = None) -> Tuple[torch.Tensor, np.ndarray, List[str]]:
    """(uint8 images [N, C, H, W], labels [N], class names) of a dataset split, all in memory.

    ``spec`` is any dataset the training engine reads (``fashion-mnist``,
    ``mnist``, ``cifar10:DIR``, ``folder:DIR``, ``tensors:FILE`` ...); image
    folders are decoded once at ``load_size`` with ``channels`` channels.
    """
    from ..data.datasets import open_dataset

    ds = open_dataset(spec, split, load_size=load_size, channels=channels, classes=classes)
    if not ds.in_memory:
        ds = ds.to_memory()
    return ds.images, ds.labels.numpy(), list(ds.classes)


def _size(values: Optional[List[int]]):
    if not values:
        return None
    if len(values) > 2:
        raise UsageError("--img-size takes N or H W")
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _format_table(results: Dict[str, Dict[str, Any]], shots: List[int]) -> str:
    head = ["model"] + [f"{k}-shot" for k in shots] + (["all data"] if any("linear_probe" in r
                                                                          for r in results.values()) else [])
    rows = [head]
    for name, r in results.items():
        row = [name]
        for entry in r.get("fewshot", []):
            row.append(f"{100 * entry['mean']:.2f} ± {100 * entry['std']:.2f}")
        if "linear_probe" in r:
            row.append(f"{100 * r['linear_probe']['accuracy']:.2f}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


# --- commands --------------------------------------------------------------------
def _fewshot(args) -> int:
    from ..eval.fewshot import DEFAULT_L2_GRID, evaluate_frozen
    from ..utils import write_json_atomic

    if not args.checkpoints and not args.pixels:
        raise UsageError("give at least one CHECKPOINT, or --pixels for the raw-pixel baseline")
    shots = sorted(set(args.shots or []))
    if not shots and not args.linear_probe:
        raise UsageError("nothing to do: give --shots or --linear-probe")
    if args.seeds < 1:
        raise UsageError("--seeds must be at least 1")
    models = [(ckpt, load_checkpoint(ckpt, _size(args.img_size), device=args.device)) for ckpt in args.checkpoints]
    chans = models[0][1].config.in_chans if models else 3
    size = args.load_size or (max(models[0][1].config.img_size) if models else 224)
    train_x, train_y, classes = load_split(args.data, "train", chans, size)
    test_x, test_y, _ = load_split(args.data, "test", chans, size, classes)
    if args.train_limit:
        train_x, train_y = train_x[:args.train_limit], train_y[:args.train_limit]
    if args.test_limit:
        test_x, test_y = test_x[:args.test_limit], test_y[:args.test_limit]
    cache = None if args.no_cache else str(Path(args.cache_dir).expanduser())
    common = dict(shots=shots, seeds=list(range(args.seeds)), l2_grid=args.l2 or DEFAULT_L2_GRID,
                  val_per_class=args.val_per_class, probe=args.linear_probe, cache_dir=cache,
                  data_id=f"{args.data}:{len(train_y)}:{len(test_y)}", batch_size=args.batch_size,
                  device=args.device, progress=not args.quiet, num_classes=len(classes))
    results: Dict[str, Dict[str, Any]] = {}
    if args.pixels:
        results["pixels"] = evaluate_frozen(None, train_x, train_y, test_x, test_y, representation="pixels",
                                            **common)
    for ckpt, model in models:
        results[ckpt] = evaluate_frozen(model, train_x, train_y, test_x, test_y,
                                        representation=args.representation, **common)
    report = {"data": args.data, "classes": classes, "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.data}: test accuracy (%) of a linear probe on frozen features, mean ± std over "
              f"{args.seeds} seed(s)")
        print(_format_table(results, shots))
    if args.out:
        out = Path(args.out)
        write_json_atomic(out / "fewshot.json", report)
        written = [str(out / "fewshot.json")]
        try:
            from ..analysis.plots import plot_fewshot
            if shots:
                plot_fewshot(results, out / "fewshot.png", title=f"linear few-shot evaluation, {args.data}")
                written.append(str(out / "fewshot.png"))
        except ImportError as err:
            print(f"vitkit fewshot: no plot ({err})", file=sys.stderr)
        print("wrote " + ", ".join(written), file=sys.stderr)
    return 0


def _dataset_images(spec: str, n_rollout: int, channels: int, size: int):
    """The test split and the indices shown in the rollout grid: the first image of each class first."""
    x, y, classes = load_split(spec, "test", channels, size)
    firsts = [int(np.flatnonzero(y == c)[0]) for c in np.unique(y)]
    taken = set(firsts)
    rest = [i for i in range(min(len(y), n_rollout + len(firsts))) if i not in taken]
    return x, y, classes, (firsts + rest)[:max(n_rollout, 0)]


def _analyze(args) -> int:
    from ..analysis.report import analyze, load_images
    from ..eval.features import model_preprocessing, prepare_images

    if not args.images and not args.data:
        raise UsageError("give IMAGE files or folders, or --data fashion-mnist, to analyse the model on")
    require("plots", "matplotlib", what="vitkit analyze")  # its figures: before loading anything
    model = load_checkpoint(args.checkpoint, _size(args.img_size), args.device)
    cfg = model.config
    display, inputs, names = [], [], []
    many = ManyFiles("analyze")
    for path in many.images(args.images):  # a bad image is reported and skipped, as in predict
        try:
            d, x, n = load_images([path], model)
        except (OSError, ValueError) as err:
            many.skip(path, err)
            continue
        many.ok += 1
        display.append(d)
        inputs.append(x)
        names += n
    dist_inputs = None
    if args.data:
        xs, ys, classes, pick = _dataset_images(args.data, args.rollout_images, cfg.in_chans, max(cfg.img_size))
        pre = model_preprocessing(model)
        dist_inputs = prepare_images(xs[:args.num_images], cfg.img_size, cfg.in_chans, pre)
        if pick:
            x = prepare_images(xs[pick], cfg.img_size, cfg.in_chans, pre)
            d = prepare_images(xs[pick], cfg.img_size, cfg.in_chans, {"mean": [0.0], "std": [1.0]})
            display.append(d)
            inputs.append(x)
            names += [f"{classes[int(ys[i])]} (test #{i})" for i in pick]
    if not inputs:
        raise DataError("no images for the rollout grid: give IMAGE files or --rollout-images N >= 1")
    summary = analyze(model, torch.cat(inputs), args.out, display=torch.cat(display), names=names,
                      distance_inputs=dist_inputs, head_fusion=args.head_fusion, num_filters=args.filters,
                      batch_size=args.batch_size, title=args.title,
                      extra={"checkpoint": str(args.checkpoint), "data": args.data})
    per_layer = summary["attention_distance"]["mean_per_layer"]
    print("mean attention distance per layer (px): " + " ".join(f"{v:.1f}" for v in per_layer))
    pe = summary["posemb_similarity"]
    if "neighbours" in pe:
        print(f"position-embedding similarity: neighbours {pe['neighbours']:.3f}, far patches {pe['far']:.3f}")
    print(f"wrote {', '.join(summary['files'].values())}, attention_distance.json, summary.json into {args.out}")
    return many.exit_code("images", "analysed")
