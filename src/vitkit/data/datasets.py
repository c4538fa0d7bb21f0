"""Labelled image datasets for training and evaluation: the sources (IDX, CIFAR, image folders, tensor
files) of the two dataset kinds of :mod:`vitkit.data.images`.

:func:`open_dataset` turns a short spec (``fashion-mnist``, ``cifar10``,
``folder:/data/pets``, ``shards:/data/train-{000..015}.tar``,
``tensors:/data/x.npz``) and a split name into one of these.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..errors import ConfigError, DataError, InputError, NotFoundError
from ..utils import PathLike
from .idx import FASHION_MNIST_CLASSES, MNIST_CLASSES, load_idx_split
from .images import Dataset, FileImages, TensorImages
from .preprocess import IMAGE_EXTENSIONS

MNIST_DIRS = ("/usr/share/datasets/mnist",)
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]




# --- IDX (Fashion-MNIST, MNIST) -------------------------------------------------
def fashion_mnist(split: str = "train", root: Optional[PathLike] = None) -> TensorImages:
    """Fashion-MNIST from ``root`` or Debian's /usr/share/datasets/fashion-mnist (60k train / 10k test)."""
    x, y = load_idx_split(split, root)
    return TensorImages(torch.from_numpy(x.copy()), torch.from_numpy(y), list(FASHION_MNIST_CLASSES),
                        f"fashion-mnist/{split}")


def mnist(split: str = "train", root: Optional[PathLike] = None) -> TensorImages:
    """MNIST from its IDX files (``root``, else /usr/share/datasets/mnist), in memory."""
    x, y = load_idx_split(split, root, defaults=MNIST_DIRS)
    return TensorImages(torch.from_numpy(x.copy()), torch.from_numpy(y), list(MNIST_CLASSES), f"mnist/{split}")


# --- CIFAR-10/100 python batches ------------------------------------------------------
def cifar(root: PathLike, split: str = "train", which: Optional[int] = None) -> TensorImages:
    """CIFAR-10 (``data_batch_1..5``, ``test_batch``, ``batches.meta``) or CIFAR-100 (``train``, ``test``,
    ``meta``; fine labels) from the python-pickle release folder. Pickles hold plain numpy arrays and
    are read with a restricted unpickler that refuses anything else."""
    folder = Path(root)
    if split not in ("train", "test"):
        raise InputError(f"split must be 'train' or 'test', got {split!r}")
    if which is None:
        which = 100 if (folder / "meta").is_file() and not (folder / "batches.meta").is_file() else 10
    if which == 10:
        files = [folder / f"data_batch_{i}" for i in range(1, 6)] if split == "train" else [folder / "test_batch"]
        meta_file, label_key, names_key = folder / "batches.meta", "labels", "label_names"
    elif which == 100:
        files, meta_file, label_key, names_key = [folder / split], folder / "meta", "fine_labels", "fine_label_names"
    else:
        raise InputError(f"CIFAR comes as 10 or 100 classes, got {which}")
    missing = [str(f) for f in files + [meta_file] if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-{which} python batches not found: missing {', '.join(missing)}. Download "
            f"cifar-{which}-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, extract it and pass "
            f"the folder (cifar-10-batches-py or cifar-100-python)")
    xs, ys = [], []
    for f in files:
        d = _load_pickle(f)
        data = np.asarray(d["data"], dtype=np.uint8)
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[label_key], dtype=np.int64))
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _load_pickle(meta_file)[names_key]]
    return TensorImages(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), names,
                        f"cifar{which}/{split}")


class _SafeUnpickler(pickle.Unpickler):
    _ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
                ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
                ("numpy._core.multiarray", "scalar")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _load_pickle(path: Path) -> Dict[Any, Any]:
    try:
        with open(path, "rb") as f:
            d = _SafeUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataError(f"{path}: not a CIFAR python batch ({err})") from None
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


# --- image folders ------------------------------------------------------------------------
def image_folder(root: PathLike, split: Optional[str] = None, *, load_size: int = 256, channels: int = 3,
                 classes: Optional[List[str]] = None) -> FileImages:
    """``root/<class>/*.jpg`` (one sub-folder per class, sorted names = label order), or
    ``root/<split>/<class>/*.jpg`` when ``split`` is given and ``root/<split>`` exists (the authors'
    ``{train,test}/class`` layout, ImageNet's ``{train,val}/class``). Pass ``classes`` to fix the label order
    (e.g. the training split's)."""
    folder = Path(root)
    if not folder.is_dir():
        raise NotFoundError("image folder not found", path=folder,
                            hint="expected ROOT/<class>/*.jpg or ROOT/{train,val,test}/<class>/*.jpg")
    if split is not None and (folder / split).is_dir():
        folder = folder / split
    elif split not in (None, "train"):
        splits = folder_splits(folder)
        has = f"it has {', '.join(s + '/' for s in splits)}" if splits else "it is a flat ROOT/<class>/ tree"
        raise NotFoundError(
            f"image folder {folder / split} not found ({has})", path=None,
            hint="set data.eval_split to auto (test/, else val/, else none), to one of its splits, or to null "
                 "for no test split (--set data.eval_split=...)")
    found = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not found:
        raise FileNotFoundError(f"{folder} has no class sub-folders: expected {folder}/<class>/*.jpg")
    classes = list(classes) if classes is not None else found
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise DataError(f"{folder}: class folders {unknown} are not among the training classes")
    items = []
    for label, name in enumerate(classes):
        d = folder / name
        if d.is_dir():
            items += [(p, label) for p in sorted(d.rglob("*")) if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()]
    if not items:
        raise NotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in the class folders", path=folder)
    return FileImages(items, classes, load_size, channels, f"folder:{folder}")


def folder_splits(root: PathLike) -> List[str]:
    """The split sub-folders (train, val, test) of an image folder in the split layout (one with ``train/``);
    [] for a flat ``ROOT/<class>/`` tree."""
    folder = Path(root)
    if not (folder / "train").is_dir():
        return []
    return [s for s in ("train", "val", "test") if (folder / s).is_dir()]


# --- tensors ------------------------------------------------------------------------------------
def tensor_file(path: PathLike, split: str = "train") -> TensorImages:
    """``.npz`` with ``{split}_images``/``{split}_labels`` (or ``images``/``labels``) and optional
    ``classes``; or a ``.pt`` file holding such a dict of tensors (read with weights_only=True)."""
    p = Path(path)
    if not p.is_file():
        raise NotFoundError("tensor file not found", path=p, hint="check the path after tensors:")
    d = _read_tensor_file(p)
    if not isinstance(d, dict):
        raise DataError(f"holds a {type(d).__name__}, expected a dict with 'images' and 'labels'", path=p)
    x = d.get(f"{split}_images", d.get("images"))
    y = d.get(f"{split}_labels", d.get("labels"))
    if x is None or y is None:
        raise DataError(f"{p}: needs arrays '{split}_images' and '{split}_labels' (or 'images' and 'labels'); "
                         f"found {sorted(d)}")
    x, y = torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y)).long()
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):  # NHWC -> NCHW
        x = x.permute(0, 3, 1, 2).contiguous()
    classes = d.get("classes")
    classes = [str(c) for c in np.asarray(classes).tolist()] if classes is not None else \
        [str(i) for i in range(int(y.max()) + 1 if len(y) else 0)]
    return TensorImages(x, y, classes, f"tensors:{p.name}/{split}")


def _read_tensor_file(p: Path) -> Any:
    """The arrays of a ``.npz`` (no pickled objects) or ``.pt`` (torch.load weights_only=True) file; a
    damaged or code-carrying file raises DataError naming it."""
    import zipfile
    try:
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        why = " ".join(str(err).split())
        code = any(w in why for w in ("GLOBAL", "allowlisted", "Can only", "is blocked"))
        raise DataError("refused: it holds Python objects that would run code when loaded" if code else
                        "is corrupt (its pickle cannot be read)", path=p,
                        hint="save plain tensors or arrays (images uint8 [N, C, H, W], labels int [N])") from None
    except ValueError as err:
        if "pickle" in str(err).lower():  # numpy: object arrays need pickle, which vitkit never allows
            raise DataError("holds object arrays (pickled Python objects), which vitkit does not load", path=p,
                            hint="save numeric arrays: np.savez(path, images=uint8_array, labels=int_array)") from None
        raise DataError(f"could not be read ({' '.join(str(err).split())})", path=p,
                        hint="the file is truncated or corrupt") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError, KeyError, UnicodeDecodeError) as err:
        raise DataError(f"could not be read ({' '.join(str(err).split()) or type(err).__name__})", path=p,
                        hint="the file is truncated or corrupt, write it again") from None


EVAL_SPLITS = ("test", "val")  # what data.eval_split: auto looks for, in this order


def auto_eval_split(spec: str, root: Optional[PathLike] = None) -> Optional[str]:
    """The split ``data.eval_split: auto`` evaluates on: ``test`` where the dataset has one, else ``val``, else
    None (the run then has no test split; its validation hold-out comes from the training images).
    Fashion-MNIST, MNIST and CIFAR have ``test``; an image folder the split sub-folders it has (a flat
    ``ROOT/<class>/`` tree none); a tensor file the ``test_images`` / ``val_images`` arrays it holds; a
    shard pattern with ``{split}`` the splits whose files exist."""
    kind, _, path = spec.partition(":")
    kind = kind.strip().lower().replace("_", "-")
    path = path or (str(root) if root is not None else "")
    if kind == "folder":
        have = folder_splits(path)
    elif kind == "tensors":
        p = Path(path)
        have = [s for s in EVAL_SPLITS if p.is_file() and f"{s}_images" in _read_tensor_file(p)]
    elif kind == "shards":
        from .shards import expand_pattern
        have = [s for s in EVAL_SPLITS if "{split}" in path
                and all(Path(f).is_file() for f in expand_pattern(path.replace("{split}", s)) or [""])]
    else:
        have = ["test"]
    return next((s for s in EVAL_SPLITS if s in have), None)


# --- one entry point ----------------------------------------------------------------------------
KNOWN = ("fashion-mnist", "mnist", "cifar10", "cifar100", "folder", "shards", "tensors")


def open_dataset(spec: str, split: str = "train", *, root: Optional[PathLike] = None, load_size: int = 256,
                 channels: int = 3, classes: Optional[List[str]] = None) -> Dataset:
    """A dataset from a spec: ``fashion-mnist[:DIR]``, ``mnist[:DIR]``, ``cifar10:DIR``,
    ``cifar100:DIR``, ``folder:DIR``, ``shards:PATTERN`` (``{train}`` in the pattern is replaced by the
    split), ``tensors:FILE``. ``root`` is used when the spec has no path."""
    kind, _, path = spec.partition(":")
    kind = kind.strip().lower().replace("_", "-")
    path = path or (str(root) if root is not None else None)
    if kind in ("fashion-mnist", "fmnist"):
        return fashion_mnist(split, path)
    if kind == "mnist":
        return mnist(split, path)
    if kind in ("cifar10", "cifar100", "cifar-10", "cifar-100"):
        if not path:
            raise ConfigError(f"{spec}: give the folder of the python batches, e.g. {kind}:/data/cifar-10-batches-py")
        return cifar(path, split, 100 if kind.endswith("100") else 10)
    if kind == "folder":
        if not path:
            raise ConfigError("folder: give the folder, e.g. folder:/data/pets")
        return image_folder(path, split, load_size=load_size, channels=channels, classes=classes)
    if kind == "shards":
        from .shards import tar_shards
        if not path:
            raise ConfigError("shards: give a pattern, e.g. shards:/data/{split}-{000..015}.tar")
        return tar_shards(path.replace("{split}", split), load_size=load_size, channels=channels, classes=classes)
    if kind == "tensors":
        if not path:
            raise ConfigError("tensors: give a .npz or .pt file, e.g. tensors:/data/digits.npz")
        return tensor_file(path, split)
    raise ConfigError(f"unknown dataset {spec!r}: use one of {', '.join(KNOWN)} (e.g. 'fashion-mnist', "
                     f"'folder:/data/pets', 'cifar10:/data/cifar-10-batches-py')")

