"""Evaluation during training and the choice of the exported weights, both on the validation split.

The protocol of every run: the periodic evaluations and the choice between the raw and the EMA weights
read only the validation split, a seeded hold-out of the training data (``data.val_size`` or
``data.val_fraction``); the test split is read once, at the end, by the exported weights alone
(:mod:`vitkit.train.report`). A run without a validation split evaluates only at the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..data.augment import EvalTransform
from ..data.datasets import Dataset
from ..errors import ConfigError
from .distributed import Dist
from .evaluate import evaluate

WEIGHT_KINDS = ("raw", "ema")


def hold_out(data: Dataset, val_size: Optional[int], val_fraction: float, seed: int
             ) -> Tuple[Dataset, Optional[Dataset]]:
    """(training part, validation part or None) of a training split: a seeded hold-out of ``val_size``
    images (or ``val_fraction`` of them), class-stratified; the same images whatever the
    training seed is. The one definition of the validation split (the trainer's, and ``vitkit reproduce``'s
    probes)."""
    from ..data.loader import split_indices

    n = len(data)
    if val_size and not 0 < val_size < n:
        raise ConfigError(f"data.val_size={val_size} but the training split has {n} images: hold out fewer "
                          f"(e.g. --set data.val_size={max(1, n // 12)})")
    fraction = val_size / n if val_size else val_fraction
    if not fraction > 0:
        return data, None
    tr, va = split_indices(n, fraction, seed, data.labels)
    return data.subset(tr, "train"), data.subset(va, "val")


def run_splits(train_full: Dataset, test: Optional[Dataset], dc: Any, seed: int
               ) -> Tuple[Dataset, Optional[Dataset], Optional[Dataset]]:
    """(train, validation or None, test or None) of a run from its full training split and its test split,
    by the recipe's data section ``dc``: the validation hold-out (:func:`hold_out`, the same for every
    objective, MPP included: a pre-training that never reads labels must still leave out exactly the
    validation images its fine-tunes are selected on), then the optional class-stratified cuts,
    ``data.train_subset`` (few labels, seeded by ``seed``) and ``data.test_subset`` (a short run's test: the
    same images in every run)."""
    from ..data.loader import split_indices

    train, val = hold_out(train_full, dc.val_size, dc.val_fraction, dc.val_seed)
    for key, k, cut_seed in (("train", dc.train_subset, seed), ("test", dc.test_subset, 0)):
        ds = train if key == "train" else test
        if not k or ds is None:
            continue
        n = len(ds)
        if not 0 < k <= n:
            raise ConfigError(f"data.{key}_subset={k} but the {'training' if key == 'train' else key} split has "
                              f"{n} images")
        if k < n:
            ds = ds.subset(split_indices(n, k / n, cut_seed, ds.labels)[1], key)
        train, test = (ds, test) if key == "train" else (train, ds)
    return train, val, test


@dataclass
class Evaluator:
    """Accuracy of a model on a split, in the run's evaluation preprocessing and precision."""

    transform: EvalTransform
    device: torch.device
    dist: Dist
    precision: str = "fp32"
    batch_size: int = 500
    workers: int = 0

    def __call__(self, model: nn.Module, data: Dataset, keep_probs: bool = False) -> Dict[str, Any]:
        return evaluate(model, data, self.transform, batch_size=self.batch_size, device=self.device,
                        dist=self.dist, precision=self.precision, workers=self.workers,
                        keep_probs=keep_probs and not self.dist.enabled)


def eval_record(step: int, epoch: float, split: str, scores: Dict[str, Dict[str, Any]], **extra: Any
                ) -> Dict[str, Any]:
    """One ``kind: eval`` line of metrics.jsonl: top1/top5/loss of the raw weights, ``*_ema`` of the EMA."""
    rec: Dict[str, Any] = {"kind": "eval", "split": split, "step": step, "epoch": epoch}
    for kind, res in scores.items():
        suffix = "" if kind == "raw" else "_" + kind
        for k in ("top1", "top5", "loss"):
            rec[k + suffix] = res[k]
    rec.update(extra)
    return rec


def choose_weights(export: str, has_ema: bool, val: Optional[Dict[str, Dict[str, Any]]]) -> Tuple[str, str]:
    """Which weights a run exports (``"raw"`` or ``"ema"``) and why.

    ``export``: the recipe's ``train.export``; ``val``: validation scores per kind (None without a
    validation split). ``auto`` takes the better validation top-1 (the EMA weights on a tie), or the EMA
    weights when there is nothing to choose on; ``raw`` / ``ema`` are taken as asked."""
    if export not in ("auto", "raw", "ema"):
        raise ConfigError(f"train.export={export!r}: use auto, ema or raw")
    if export == "ema" and not has_ema:
        raise ConfigError("train.export=ema but train.ema is 0: turn EMA on or export raw weights")
    if not has_ema:
        return "raw", "no EMA of the weights"
    if export != "auto":
        return export, f"train.export={export}"
    if not val:
        return "ema", "no validation split to choose on: the EMA weights"
    raw, ema = val["raw"]["top1"], val["ema"]["top1"]
    if raw > ema:
        return "raw", f"validation top-1 {100 * raw:.2f}% (raw) > {100 * ema:.2f}% (EMA)"
    return "ema", f"validation top-1 {100 * ema:.2f}% (EMA) >= {100 * raw:.2f}% (raw)"
