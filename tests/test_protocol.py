"""The evaluation protocol: selection on a validation split held out of the training data, the test split
read once, at the end, by the exported weights only."""
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from _synthetic import quadrant_images
from vitkit.data.datasets import TensorImages
from vitkit.data.loader import split_indices
from vitkit.train import Trainer, list_recipes, load_recipe
from vitkit.train import report as report_module
from vitkit.train.selection import choose_weights

CLASSES = ["q0", "q1", "q2", "q3"]


@dataclass
class Tracked(TensorImages):
    """TensorImages that logs the ids (positions in the full split) of every image read."""

    origin: Optional[torch.Tensor] = None
    events: Optional[list] = None

    def gather(self, index):
        self.events.append((self.name, self.origin[index].clone()))
        return super().gather(index)

    def subset(self, index, name=None):
        index = torch.as_tensor(index, dtype=torch.int64)
        return Tracked(self.images[index], self.labels[index], self.classes, name or self.name,
                       self.origin[index], self.events)


def _split(name, n, seed, events):
    x, y = quadrant_images(n, 16, seed)
    return Tracked(torch.from_numpy(x), torch.from_numpy(y), CLASSES, name, torch.arange(n), events)


def _recipe(tmp_path):
    return load_recipe("fmnist-fast", {
        "name": "protocol", "model": {"img_size": 16, "patch_size": 4, "width": 32, "depth": 1, "num_heads": 2,
                                      "mlp_dim": 64, "pool": "gap", "class_token": False},
        "data.dataset": "tensors:unused", "data.mean": [0.2], "data.std": [0.3], "data.val_size": 64,
        "data.eval_batch_size": 50, "optim.batch_size": 32, "schedule.epochs": 2, "schedule.minutes": None,
        "schedule.warmup_steps": 2, "train.ema": 0.9, "train.eval_every": 0.5, "train.threads": 1,
        "train.predictions": 4})


def _run(tmp_path, name, test_seed, monkeypatch):
    events = []
    train, test = _split("train", 320, 0, events), _split("test", 100, test_seed, events)
    real = report_module.choose_weights

    def spy(*a, **kw):
        events.append(("choose", None))
        return real(*a, **kw)

    monkeypatch.setattr(report_module, "choose_weights", spy)
    t = Trainer(_recipe(tmp_path), tmp_path / name, progress=False, data={"train": train, "test": test})
    res = t.fit()
    return t, res, events


def test_no_test_image_reaches_training_or_selection(tmp_path, monkeypatch):
    t, res, events = _run(tmp_path, "a", 1, monkeypatch)
    names = [n for n, _ in events]
    # training reads only the training images, periodic evaluations only the validation images
    train_ids = torch.cat([ids for n, ids in events if n == "train"]).unique()
    val_ids = torch.cat([ids for n, ids in events if n == "val"]).unique()
    assert len(val_ids) == 64 and len(train_ids) == 256 and not set(val_ids.tolist()) & set(train_ids.tolist())
    assert names.count("val") >= 2 * 3 * 2  # 3 periodic + final evaluations, raw and EMA, 2 batches each
    # the test split is read after the choice of weights, once, every image exactly once
    first_test = names.index("test")
    assert "choose" in names[:first_test] and "train" not in names[first_test:] and "val" not in names[first_test:]
    test_reads = [ids for n, ids in events if n == "test" and len(ids) > 4]  # (the 4 of predictions.png apart)
    assert torch.equal(torch.cat(test_reads).sort().values, torch.arange(100))
    assert res["test_images"] == 100 and res["exported_weights"] in ("raw", "ema")
    val = res["val"]
    assert res["exported_weights"] == ("raw" if val["raw"]["top1"] > val["ema"]["top1"] else "ema")

    # other test images and labels change nothing but the test numbers: same weights, same choice
    t2, res2, _ = _run(tmp_path, "b", 7, monkeypatch)
    assert res2["val"] == res["val"] and res2["exported_weights"] == res["exported_weights"]
    a, b = t.run.model.state_dict(), t2.run.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert res2["test_top1"] != res["test_top1"] or res2["test_loss"] != res["test_loss"]


def test_choose_weights_rule():
    val = {"raw": {"top1": 0.91}, "ema": {"top1": 0.90}}
    assert choose_weights("auto", True, val)[0] == "raw"
    assert choose_weights("auto", True, {"raw": {"top1": 0.90}, "ema": {"top1": 0.90}})[0] == "ema"  # tie: EMA
    assert choose_weights("auto", True, None) == ("ema", "no validation split to choose on: the EMA weights")
    assert choose_weights("auto", False, val)[0] == "raw"
    assert choose_weights("ema", True, val)[0] == "ema" and choose_weights("raw", True, val)[0] == "raw"
    with pytest.raises(ValueError, match="train.ema is 0"):
        choose_weights("ema", False, val)


def test_every_builtin_recipe_that_evaluates_during_training_holds_out_a_validation_split():
    for name in list_recipes():
        r = load_recipe(name)
        if name.startswith("fmnist"):
            assert r.data.val_size == 5000, name  # 500 of each class's 6,000 training images
        if r.train.eval_every > 0:
            assert r.data.val_size or r.data.val_fraction > 0, name


def test_stratified_hold_out_is_exact_and_independent_of_the_training_seed():
    labels = torch.tensor([0] * 7 + [1] * 11 + [2] * 5)
    tr, va = split_indices(len(labels), 6 / 23, 0, labels)
    assert len(va) == 6 and len(tr) == 17 and not set(tr.tolist()) & set(va.tolist())
    assert torch.bincount(labels[va], minlength=3).tolist() in ([2, 3, 1], [2, 2, 2], [1, 3, 2])
    r1 = load_recipe("fmnist-fast", {"train.seed": 1})
    r2 = load_recipe("fmnist-fast", {"train.seed": 2})
    assert r1.data.val_seed == r2.data.val_seed  # every training seed is selected on the same images
