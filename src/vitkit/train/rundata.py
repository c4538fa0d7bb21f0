"""A training run's data, from its recipe: the training and test splits opened (or the datasets a caller
gives, wrapped), the validation split held out of the training split (:func:`.selection.hold_out`), the
optional training subset, and the evaluation preprocessing the exported model records."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..config import ViTConfig
from ..data.datasets import Dataset, auto_eval_split, open_dataset
from ..data.loader import split_indices
from ..errors import ConfigError
from .recipe import Recipe
from .sections import DataConfig
from .selection import hold_out


@dataclass(frozen=True)
class RunData:
    """The splits of one run and the size file datasets decode to."""

    classes: List[str]
    train: Dataset  # the training split less the validation hold-out (and cut to data.train_subset)
    val: Optional[Dataset]  # the validation hold-out (None: the recipe holds none out)
    test: Optional[Dataset]  # read once, at the end
    load_size: int  # the square file datasets decode to
    eval_split: Optional[str] = None  # the split ``test`` is (data.eval_split, ``auto`` resolved)


def open_run_data(recipe: Recipe, given: Optional[Dict[str, Dataset]] = None) -> RunData:
    """The splits ``recipe`` trains, selects and tests on; ``given`` ({"train": ..., "test": ...}): vitkit's
    datasets, or any torch / Hugging Face dataset (wrapped by :mod:`vitkit.data.external`), instead of
    ``data.dataset``."""
    r = recipe
    dc = r.data
    size_hint = r.model.get("img_size") or 224
    size_hint = size_hint if isinstance(size_hint, int) else max(size_hint)
    load_size = dc.load_size or int(round(size_hint / 0.875))
    chans = r.model.get("in_chans", "auto")
    chans = 3 if chans == "auto" else int(chans)
    if not given and not dc.dataset:
        raise ConfigError(f"recipe {r.name!r} names no dataset: pass --data (e.g. --data folder:/data/pets, whose "
                         f"sub-folders are the classes, or shards:/data/train-{{000..015}}.tar)")
    if given:
        from ..data.external import from_dataset
        wrap = lambda ds, cls=None: ds if ds is None or hasattr(ds, "gather") else from_dataset(  # noqa: E731
            ds, classes=cls, load_size=load_size, channels=chans)
        train_full = wrap(given["train"])
        test = wrap(given.get("test"), train_full.classes)
        split = "test" if test is not None else None
    else:
        train_full = open_dataset(dc.dataset, dc.train_split, root=dc.root, load_size=load_size, channels=chans)
        split = auto_eval_split(dc.dataset, dc.root) if dc.eval_split == "auto" else dc.eval_split
        test = open_dataset(dc.dataset, split, root=dc.root, load_size=load_size, channels=chans,
                            classes=train_full.classes) if split else None
    if dc.cache and not train_full.in_memory:
        train_full = train_full.to_memory()
        test = test.to_memory() if test is not None and not test.in_memory else test
    # the same class-stratified hold-out for every objective (MPP too): a pre-training that never reads
    # labels must still leave out exactly the validation images its fine-tunes are selected on
    train, val = hold_out(train_full, dc.val_size, dc.val_fraction, dc.val_seed)
    if dc.train_subset:  # few labels: a seeded, class-stratified subset of the training images
        train = _stratified_subset(train, dc.train_subset, r.train.seed + 1, "data.train_subset", "train")
    if dc.test_subset and test is not None:  # a short run's test: the same stratified images in every run
        test = _stratified_subset(test, dc.test_subset, 0, "data.test_subset", "test")
    return RunData(list(train_full.classes), train, val, test, load_size, split)


def _stratified_subset(ds: Dataset, k: int, seed: int, key: str, split: str) -> Dataset:
    """A seeded, class-stratified subset of ``k`` of ``ds``'s images (all of them when ``k`` is its size)."""
    n = len(ds)
    if not 0 < k <= n:
        raise ConfigError(f"{key}={k} but the {'training' if split == 'train' else split} split has {n} images")
    if k == n:
        return ds
    _, keep = split_indices(n, k / n, seed, ds.labels)
    return ds.subset(keep, split)


def eval_preprocessing(dc: DataConfig, config: ViTConfig, in_memory: bool, load_size: int) -> Dict[str, Any]:
    """The evaluation preprocessing of a model trained on ``dc``'s data (its normalisation at the model's
    size; ``in_memory``: the training images were decoded whole, else to ``load_size``), as a preset dict."""
    mean, std = list(dc.mean), list(dc.std)
    if len(mean) == 1:
        mean, std = mean * 3, std * 3
    return {"name": f"vitkit-train:{(dc.dataset or 'data').split(':')[0]}", "size": list(config.img_size),
            "resize": None if in_memory else load_size, "resize_mode": "squash" if in_memory else "shorter",
            "interpolation": "bilinear", "backend": "tensor" if in_memory else "pil", "mean": mean, "std": std,
            "description": "as trained by vitkit"}
