"""Datasets in every supported format (small files written here), splits and epoch orders."""
import gzip
import pickle
import struct

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import (
    EpochSampler,
    TensorImages,
    cifar,
    image_folder,
    open_dataset,
    split_indices,
    tar_shards,
    tensor_file,
    write_shards,
)
from vitkit.data.loader import Loader, eval_batches


def _idx(path, arr):
    codes = {np.uint8: 0x08}
    header = bytes([0, 0, codes[arr.dtype.type], arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


def test_idx_folder_as_fashion_mnist(tmp_path):
    rng = np.random.default_rng(0)
    written = {}
    for split, n in (("train", 20), ("t10k", 5)):
        images, labels = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)
        _idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images)
        _idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels)
        written[split] = images, labels
    d = open_dataset(f"fashion-mnist:{tmp_path}", "test")
    assert len(d) == 5 and d.images.shape == (5, 1, 28, 28) and d.classes[0] == "T-shirt/top"
    # the pixels and labels of the t10k files, in file order (not the train files, not transposed)
    assert torch.equal(d.images[:, 0], torch.from_numpy(written["t10k"][0]))
    assert d.labels.tolist() == written["t10k"][1].tolist()
    train = open_dataset("fashion-mnist", "train", root=tmp_path)
    assert train.images.dtype == torch.uint8 and torch.equal(train.images[:, 0], torch.from_numpy(written["train"][0]))
    assert train.labels.tolist() == written["train"][1].tolist()


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        open_dataset(f"fashion-mnist:{tmp_path}")


def _cifar_batch(path, n, rng, key="labels"):
    d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), key.encode(): list(rng.integers(0, 10, n))}
    with open(path, "wb") as f:
        pickle.dump(d, f)
    return d


def test_cifar10_and_cifar100_python_batches(tmp_path):
    rng = np.random.default_rng(1)
    c10 = tmp_path / "c10"
    c10.mkdir()
    batches = [_cifar_batch(c10 / f"data_batch_{i}", 4, rng) for i in range(1, 6)]
    _cifar_batch(c10 / "test_batch", 3, rng)
    with open(c10 / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    d = cifar(c10, "train")
    assert d.images.shape == (20, 3, 32, 32) and d.classes[3] == "c3"
    # CIFAR rows are R plane, G plane, B plane of 32x32
    assert torch.equal(d.images[0, 1].flatten(), torch.from_numpy(batches[0][b"data"][0, 1024:2048]))
    assert len(open_dataset(f"cifar10:{c10}", "test")) == 3

    c100 = tmp_path / "c100"
    c100.mkdir()
    _cifar_batch(c100 / "train", 6, rng, "fine_labels")
    _cifar_batch(c100 / "test", 2, rng, "fine_labels")
    with open(c100 / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"f{i}".encode() for i in range(100)]}, f)
    d = open_dataset(f"cifar100:{c100}", "train")
    assert len(d) == 6 and len(d.classes) == 100

    with pytest.raises(FileNotFoundError, match="cifar-10-python"):
        cifar(tmp_path / "nowhere")


def test_cifar_loader_refuses_code_in_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "test_batch").write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
    (tmp_path / "batches.meta").write_bytes(pickle.dumps({"label_names": []}))
    with pytest.raises(ValueError, match="not a CIFAR python batch"):
        cifar(tmp_path, "test", 10)


def _write_images(folder, classes, n, size=(20, 14)):
    rng = np.random.default_rng(2)
    for c in classes:
        (folder / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, size + (3,), dtype=np.uint8)).save(folder / c / f"{i}.png")


def test_image_folder_layouts(tmp_path):
    _write_images(tmp_path / "flat", ["cat", "dog"], 3)
    d = image_folder(tmp_path / "flat", load_size=16)
    assert len(d) == 6 and d.classes == ["cat", "dog"] and d.labels.tolist() == [0, 0, 0, 1, 1, 1]
    x, y = d.gather(torch.tensor([0, 5]))
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.uint8 and y.tolist() == [0, 1]
    # at the shorter side's own size (14 of 20 x 14) nothing is resampled: the centre crop is rows 3..16,
    # channels first, of the file's pixels
    files = image_folder(tmp_path / "flat", load_size=14).gather(torch.tensor([1, 4]))[0]
    for got, path in zip(files, (tmp_path / "flat" / "cat" / "1.png", tmp_path / "flat" / "dog" / "1.png")):
        with Image.open(path) as im:
            assert torch.equal(got, torch.from_numpy(np.array(im)[3:17]).permute(2, 0, 1)), path
    # the authors' {train,test}/class layout; the test split keeps the training label order
    _write_images(tmp_path / "split" / "train", ["a", "b", "c"], 2)
    _write_images(tmp_path / "split" / "test", ["b", "c"], 1)
    tr = open_dataset(f"folder:{tmp_path / 'split'}", "train", load_size=8)
    te = open_dataset(f"folder:{tmp_path / 'split'}", "test", load_size=8, classes=tr.classes)
    assert tr.classes == ["a", "b", "c"] and te.labels.tolist() == [1, 2]
    mem = te.to_memory()
    assert mem.in_memory and mem.images.shape == (2, 3, 8, 8)
    gray = image_folder(tmp_path / "flat", load_size=8, channels=1)
    assert gray.gather(torch.tensor([0]))[0].shape == (1, 1, 8, 8)
    (tmp_path / "flat" / "cat" / "bad.png").write_bytes(b"not an image")
    bad = image_folder(tmp_path / "flat", load_size=8)
    with pytest.raises(ValueError, match="bad.png"):
        bad.gather(torch.arange(len(bad)))


def test_auto_eval_split_finds_test_else_val_else_none(tmp_path):
    from vitkit.data.datasets import auto_eval_split
    assert auto_eval_split("fashion-mnist") == auto_eval_split("cifar10:/x") == "test"
    _write_images(tmp_path / "flat", ["cat", "dog"], 1)
    _write_images(tmp_path / "inet" / "train", ["cat", "dog"], 1)
    _write_images(tmp_path / "inet" / "val", ["cat"], 1)
    assert auto_eval_split(f"folder:{tmp_path / 'flat'}") is None
    assert auto_eval_split(f"folder:{tmp_path / 'inet'}") == "val"
    _write_images(tmp_path / "inet" / "test", ["dog"], 1)
    assert auto_eval_split("folder", root=tmp_path / "inet") == "test"
    x = np.zeros((2, 1, 4, 4), np.uint8)
    np.savez(tmp_path / "plain.npz", images=x, labels=np.zeros(2, np.int64))
    np.savez(tmp_path / "val.npz", train_images=x, train_labels=np.zeros(2), val_images=x, val_labels=np.zeros(2))
    assert auto_eval_split(f"tensors:{tmp_path / 'plain.npz'}") is None  # never the training images again
    assert auto_eval_split(f"tensors:{tmp_path / 'val.npz'}") == "val"
    (tmp_path / "val-0.tar").write_bytes(b"")
    assert auto_eval_split(f"shards:{tmp_path}/{{split}}-{{0..0}}.tar") == "val"
    assert auto_eval_split(f"shards:{tmp_path}/val-{{0..0}}.tar") is None


def test_train_on_the_folder_layouts_the_docs_show(tmp_path, capsys):
    """`vitkit train --data folder:DIR` with no data.eval_split: a flat DIR/<class>/ tree trains with no test
    split (the validation hold-out from the training images), an ImageNet-style DIR/{train,val}/ tree tests
    on val/; results.json records which. Asking for a split the folder lacks names what it looked for and
    the fix."""
    import json

    from _synthetic import write_recipe
    from vitkit.cli import main
    _write_images(tmp_path / "flat", ["cat", "dog"], 6, size=(16, 16))
    _write_images(tmp_path / "inet" / "train", ["cat", "dog"], 6, size=(16, 16))
    _write_images(tmp_path / "inet" / "val", ["cat", "dog"], 2, size=(16, 16))
    recipe = write_recipe(tmp_path, "unused.npz", val_size=2)
    for layout, split, tested in (("flat", None, None), ("inet", "val", 4)):
        out = tmp_path / f"run-{layout}"
        assert main(["train", "-r", str(recipe), "--data", f"folder:{tmp_path / layout}", "--steps", "2",
                     "--set", "optim.batch_size=4", "--set", "schedule.warmup_steps=1", "--set",
                     "data.mean=[0.5,0.5,0.5]", "--set", "data.std=[0.5,0.5,0.5]", "--out", str(out),
                     "--no-progress"]) == 0, capsys.readouterr().err
        results = json.loads((out / "results.json").read_text())
        assert results["eval_split"] == split and results.get("test_images") == tested
        assert results["val_images"] == 2 and results["train_images"] == 10
    capsys.readouterr()
    assert main(["train", "-r", str(recipe), "--data", f"folder:{tmp_path / 'flat'}", "--set",
                 "data.eval_split=test", "--steps", "1", "--out", str(tmp_path / "run-x"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"image folder {tmp_path / 'flat' / 'test'} not found (it is a flat ROOT/<class>/ tree)" in err
    assert "set data.eval_split to auto" in err


def test_tar_shards_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    data = TensorImages(torch.from_numpy(rng.integers(0, 256, (25, 1, 12, 12), dtype=np.uint8)),
                        torch.from_numpy(rng.integers(0, 3, 25)), ["x", "y", "z"])
    paths = write_shards(data, str(tmp_path / "train-{shard}.tar"), per_shard=10)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    d = tar_shards(str(tmp_path / "train-{000000..000002}.tar"), load_size=12, channels=1)
    assert len(d) == 25 and d.classes == ["x", "y", "z"]
    x, y = d.gather(torch.arange(25))
    assert torch.equal(x, data.images) and torch.equal(y, data.labels)  # PNG is lossless
    same = open_dataset(f"shards:{tmp_path}/{{split}}-*.tar", "train", load_size=12, channels=1)
    assert len(same) == 25
    # worker processes read by offset and give the same batches
    loader = Loader(d, EpochSampler(25, 5, seed=0), workers=2)
    serial = Loader(d, EpochSampler(25, 5, seed=0), workers=0)
    for (a, la), (b, lb) in zip(loader.epoch(1), serial.epoch(1)):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_tensor_files(tmp_path):
    # NHWC, not square: a reshape instead of a permute, or swapped H and W, gives other pixels
    x = np.random.default_rng(4).integers(0, 256, (6, 8, 10, 3), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", images=x, labels=np.arange(6) % 2, classes=np.array(["no", "yes"]))
    d = tensor_file(tmp_path / "d.npz")
    assert d.images.shape == (6, 3, 8, 10) and d.classes == ["no", "yes"]
    for c in range(3):
        assert torch.equal(d.images[:, c], torch.from_numpy(x[..., c])), c
    assert d.labels.tolist() == [0, 1, 0, 1, 0, 1]
    pt = torch.randint(0, 256, (4, 1, 5, 7), dtype=torch.uint8)
    torch.save({"train_images": pt, "train_labels": torch.tensor([0, 1, 2, 0]), "test_images": pt[:1],
                "test_labels": torch.tensor([2])}, tmp_path / "d.pt")
    from_pt = open_dataset(f"tensors:{tmp_path / 'd.pt'}")
    assert len(from_pt) == 4 and torch.equal(from_pt.images, pt) and from_pt.labels.tolist() == [0, 1, 2, 0]
    assert open_dataset(f"tensors:{tmp_path / 'd.pt'}", "test").labels.tolist() == [2]  # the split's own arrays
    with pytest.raises(ValueError, match="uint8"):
        TensorImages(torch.rand(2, 1, 4, 4), torch.tensor([0, 1]), ["a", "b"])
    with pytest.raises(ValueError, match="labels must be in"):
        TensorImages(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 5]), ["a", "b"])
    with pytest.raises(ValueError, match="unknown dataset"):
        open_dataset("imagenet")


def test_split_is_deterministic_disjoint_and_stratified():
    labels = torch.arange(1000) % 10
    tr, va = split_indices(1000, 0.1, seed=3, labels=labels)
    tr2, va2 = split_indices(1000, 0.1, seed=3, labels=labels)
    assert torch.equal(tr, tr2) and torch.equal(va, va2)
    assert len(va) == 100 and len(set(tr.tolist()) & set(va.tolist())) == 0 and len(tr) + len(va) == 1000
    assert torch.bincount(labels[va]).tolist() == [10] * 10
    assert not torch.equal(split_indices(1000, 0.1, seed=4, labels=labels)[1], va)
    with pytest.raises(ValueError):
        split_indices(10, 1.0)


def test_epoch_order_ranks_and_resume_position():
    one = EpochSampler(100, 20, seed=7)
    a, b = EpochSampler(100, 20, seed=7, rank=0, world=2), EpochSampler(100, 20, seed=7, rank=1, world=2)
    for g, x, y in zip(one.batches(2), a.batches(2), b.batches(2)):
        assert sorted(g.tolist()) == sorted(x.tolist() + y.tolist()) and len(x) == len(y) == 10
    assert torch.equal(torch.cat(list(one.batches(2))).sort().values, torch.arange(100))
    assert not torch.equal(one.order(0), one.order(1))
    rest = list(one.batches(2, start=3))
    assert len(rest) == 2 and torch.equal(rest[0], list(one.batches(2))[3])
    with pytest.raises(ValueError, match="divisible"):
        EpochSampler(100, 20, world=3)


def test_eval_batches_cover_every_sample_once_across_ranks():
    # each sample's label is its index, and its pixels carry it too: a repeated or skipped sample shows
    d = TensorImages(torch.arange(23, dtype=torch.uint8).view(23, 1, 1, 1).expand(23, 1, 2, 2).contiguous(),
                     torch.arange(23), [str(i) for i in range(23)])
    seen = []
    for rank in range(3):
        mine = []
        for x, y in eval_batches(d, 4, rank, 3):
            assert len(y) <= 4 and torch.equal(x[:, 0, 0, 0].long(), y)
            mine += y.tolist()
        assert mine == sorted(mine) and mine == list(range(mine[0], mine[-1] + 1))  # in order, contiguous
        seen += mine
    assert sorted(seen) == list(range(23))  # every sample exactly once


# --- any torch Dataset or Hugging Face dataset as training data -------------------------------------
class _QuadrantsDataset(torch.utils.data.Dataset):
    """A plain torch Dataset of (PIL image, label), as torchvision's datasets give them."""

    def __init__(self, n, seed, as_float=False):
        from _synthetic import quadrant_images
        self.x, self.y = quadrant_images(n, 16, seed)
        self.as_float, self.classes = as_float, [f"q{i}" for i in range(4)]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        from PIL import Image
        img = self.x[i, 0]
        return (torch.from_numpy(img).float()[None] / 255.0 if self.as_float else Image.fromarray(img)), int(self.y[i])


def test_torch_dataset_items_decode_like_image_folders():
    from vitkit.data import from_dataset
    ds = from_dataset(_QuadrantsDataset(12, 0), load_size=16, channels=1)
    assert ds.classes == [f"q{i}" for i in range(4)] and len(ds) == 12 and not ds.in_memory
    x, y = ds.gather(torch.tensor([3, 5]))
    assert x.dtype == torch.uint8 and x.shape == (2, 1, 16, 16) and y.tolist() == [int(ds.labels[3]), int(ds.labels[5])]
    src = _QuadrantsDataset(12, 0)
    assert torch.equal(x[0, 0], torch.from_numpy(src.x[3, 0]))  # same size: the pixels unchanged
    floats = from_dataset(_QuadrantsDataset(12, 0, as_float=True), load_size=16, channels=1)
    assert torch.equal(floats.gather(torch.tensor([3]))[0], x[:1])  # [0, 1] floats round back to the bytes
    sub = ds.subset([5, 1], "val")
    assert torch.equal(sub.gather(torch.tensor([0]))[0], x[1:])
    with pytest.raises(ValueError, match="labels must be in"):
        from_dataset(_QuadrantsDataset(12, 0), classes=["a", "b"])


def test_trainer_takes_a_torch_dataset_and_a_hugging_face_one(tmp_path):
    """The tiny recipe trained on a torch Dataset (train) and tested on a Hugging Face datasets split
    (test) computes exactly what it computes from the same images as tensors."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    from _synthetic import quadrant_images, write_npz, write_recipe
    from vitkit.train import Trainer, load_recipe
    from vitkit.train.runlog import read_metrics
    xte, yte = quadrant_images(128, 16, 1)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[f"q{i}" for i in range(4)])})
    hf = datasets.Dataset.from_dict({"image": [Image.fromarray(a[0]) for a in xte], "label": yte.tolist()},
                                    features=features)
    recipe = load_recipe(write_recipe(tmp_path, write_npz(tmp_path / "q.npz")),
                         {"schedule.epochs": 2, "train.predictions": 0, "data.load_size": 16, "model.in_chans": 1})
    ours = Trainer(recipe, tmp_path / "external", progress=False,
                   data={"train": _QuadrantsDataset(576, 0), "test": hf}).fit()
    ref = Trainer(recipe, tmp_path / "tensors", progress=False).fit()
    assert ours["test_top1"] == ref["test_top1"] and ours["val"] == ref["val"]
    losses = [[r["loss"] for r in read_metrics(tmp_path / run) if r["kind"] == "train"]
              for run in ("external", "tensors")]
    assert losses[0] == losses[1] and len(losses[0]) > 3
