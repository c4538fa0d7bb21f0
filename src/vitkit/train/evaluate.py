"""Accuracy of a model on a dataset (top-1, top-5, loss), in the model's own preprocessing."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ViTConfig
from ..data.augment import EvalTransform, Normalize
from ..data.datasets import Dataset, open_dataset
from ..data.loader import eval_batches
from ..errors import ConfigError, DataError
from ..utils import PathLike
from .distributed import Dist, all_reduce_sum

if TYPE_CHECKING:
    from .sections import DataConfig

TTA_MODES = ("none", "flip")


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, transform: EvalTransform, *, batch_size: int = 500,
             device: Optional[torch.device] = None, dist: Optional[Dist] = None, precision: str = "fp32",
             workers: int = 0, keep_probs: bool = False, tta: str = "none", progress: bool = False) -> Dict[str, Any]:
    """{"top1", "top5", "loss", "n"} over every sample of ``data`` (shared across ranks when distributed);
    with ``keep_probs`` also "probs" [N, K] (single process only); ``progress``: a progress bar (rank 0).

    ``tta="flip"``: test-time augmentation, each image is scored as the mean of the softmax probabilities
    of the image and its mirror image (loss: cross-entropy of that mean). ``"none"``: one view, scored by
    its logits.
    """
    if tta not in TTA_MODES:
        raise ConfigError(f"tta={tta!r}: use one of {', '.join(TTA_MODES)}")
    dist = dist or Dist()
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # correct1, correct5, loss, n
    probs: List[torch.Tensor] = []
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    ac = torch.autocast(device.type, dtype=half) if half is not None else _null()
    from tqdm.auto import tqdm
    bar = tqdm(total=math.ceil(len(data) / dist.world), unit="img", desc="eval", leave=False,
               disable=not progress or dist.rank != 0)
    unreadable: List[int] = []  # indices of files a folder dataset could not decode (skip_unreadable)
    for images, labels in eval_batches(data, batch_size, dist.rank, dist.world, workers):
        bar.update(len(labels))
        if bool((labels < 0).any()):
            unreadable += (-labels[labels < 0] - 1).tolist()
            images, labels = images[labels >= 0], labels[labels >= 0]
            if not len(labels):
                continue
        x = transform(images).to(device, non_blocking=True)
        y = labels.to(device)
        with ac:
            logits = model(torch.cat([x, x.flip(-1)]) if tta == "flip" else x)
        logits = logits.float()
        if tta == "flip":  # score = log of the mean probability of the two views
            logits = logits.log_softmax(1).view(2, len(y), -1).logsumexp(0) - math.log(2)
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        sums[0] += (top[:, 0] == y).sum().item()
        sums[1] += (top == y[:, None]).any(1).sum().item()
        sums[2] += F.cross_entropy(logits, y, reduction="sum").item()
        sums[3] += len(y)
        if keep_probs:
            probs.append(logits.softmax(1).cpu())
    bar.close()
    sums = all_reduce_sum(sums.to(device), dist).cpu() if dist.enabled else sums
    model.train(was_training)
    n = max(float(sums[3]), 1.0)
    out: Dict[str, Any] = {"top1": float(sums[0]) / n, "top5": float(sums[1]) / n, "loss": float(sums[2]) / n,
                           "n": int(sums[3])}
    if keep_probs:
        out["probs"] = torch.cat(probs) if probs else torch.zeros(0)
    if unreadable:
        out["unreadable"] = sorted(unreadable)
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _why_unreadable(data: Dataset, i: int) -> Dict[str, str]:
    src = data.items[i][0]
    try:
        data.decode(i)
    except ValueError as err:
        return {"path": str(src), "error": str(err)}
    return {"path": str(src), "error": "could not be read during evaluation"}


def eval_preprocessing(dc: "DataConfig", config: ViTConfig, in_memory: bool, load_size: int) -> Dict[str, Any]:
    """The evaluation preprocessing of a model trained on ``dc``'s data (its normalisation at the model's
    size; ``in_memory``: the training images were decoded whole, else to ``load_size``), as a preset dict."""
    mean, std = list(dc.mean), list(dc.std)
    if len(mean) == 1:
        mean, std = mean * 3, std * 3
    return {"name": f"vitkit-train:{(dc.dataset or 'data').split(':')[0]}", "size": list(config.img_size),
            "resize": None if in_memory else load_size, "resize_mode": "squash" if in_memory else "shorter",
            "interpolation": "bilinear", "backend": "tensor" if in_memory else "pil", "mean": mean, "std": std,
            "description": "as trained by vitkit"}


def transform_for(preprocessing: Optional[Dict[str, Any]], config: ViTConfig, data: Dataset) -> EvalTransform:
    """The evaluation view of ``data`` for a model of ``config`` whose ``preprocessing`` record (a checkpoint's,
    or the one a training run writes) gives mean/std and size: the one evaluation pipeline of ``vitkit eval``,
    the trainer and a distillation teacher. Files decoded larger than the model are centre-cropped; a dataset
    held in memory (``data.in_memory``) is resized whole."""
    pre = preprocessing or {}
    mean, std = pre.get("mean", [0.5]), pre.get("std", [0.5])
    size = tuple(pre.get("size") or config.img_size)
    return EvalTransform(size, Normalize(mean, std, channels=config.in_chans), center_crop_files=not data.in_memory)


def evaluate_checkpoint(path: PathLike, dataset: str, split: str = "test", *, root: Optional[PathLike] = None,
                        batch_size: int = 500, device: str = "auto", workers: int = 0,
                        mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                        tta: str = "none", progress: bool = False) -> Dict[str, Any]:
    """Load a checkpoint (any format vitkit reads) and measure its accuracy on ``dataset``/``split`` with
    the preprocessing stored in the checkpoint (or ``mean``/``std`` given here); ``tta`` as in
    :func:`evaluate`; ``progress`` shows a progress bar."""
    from .distributed import pick_device
    from .weights import load_for_eval

    model, labels, pre = load_for_eval(path)
    dev = pick_device(device)
    model.to(dev)
    cfg = model.config
    pre = dict(pre or {})
    if mean is not None:
        pre["mean"] = list(mean)
    if std is not None:
        pre["std"] = list(std)
    load_size = pre.get("resize") or int(round(cfg.img_size[0] / 0.875))
    data = open_dataset(dataset, split, root=root, load_size=int(load_size), channels=cfg.in_chans,
                        classes=labels if dataset.startswith("folder") else None)
    if getattr(data, "channels", cfg.in_chans) != cfg.in_chans:
        raise DataError(f"{dataset} has {data.channels}-channel images but the model takes {cfg.in_chans}")
    if cfg.num_classes and len(data.classes) > cfg.num_classes:
        raise DataError(f"{dataset} has {len(data.classes)} classes but the model predicts {cfg.num_classes}: "
                        f"fine-tune it first (vitkit finetune)")
    if hasattr(data, "skip_unreadable"):  # a folder: unreadable images are left out and reported
        data.skip_unreadable = True
    tf = transform_for(pre, cfg, data)
    res = evaluate(model, data, tf, batch_size=batch_size, device=dev, workers=workers, tta=tta, progress=progress)
    if "unreadable" in res:  # (index -> why), decoded again here to name the reason
        res["unreadable"] = [_why_unreadable(data, i) for i in res["unreadable"]]
    res.update(dataset=dataset, split=split, checkpoint=str(path), tta=tta)
    return res
