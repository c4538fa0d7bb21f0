"""IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed, read without trusting their headers."""
from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import DataError, InputError, NotFoundError
from ..utils import PathLike

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot"]
MNIST_CLASSES = [str(i) for i in range(10)]
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist package
DATA_DIR_ENV = "VITKIT_DATA_DIR"
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def data_home() -> Path:
    """The user's data folder, where ``vitkit data fetch`` puts datasets (no root needed): ``$VITKIT_DATA_DIR``,
    else ``$XDG_CACHE_HOME/vitkit/data`` (``~/.cache/vitkit/data``)."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vitkit" / "data"


def fashion_mnist_dirs() -> Tuple[Path, ...]:
    """Where Fashion-MNIST is looked for, in order: Debian's package, then the user's data folder."""
    return Path(DEBIAN_FASHION_MNIST), data_home() / "fashion-mnist"


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX array; raise DataError naming the file when it is corrupt or truncated."""
    path = Path(path)
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read()
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: cannot read IDX data ({err}); the file is corrupt or truncated") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_DTYPES[raw[2]])
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != need:
        raise DataError(f"{path}: IDX header promises {shape} ({need} bytes) but the file holds "
                        f"{len(raw) - header} bytes: truncated or corrupt")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _find(folder: Path, stem: str) -> Optional[Path]:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        if (folder / name).is_file():
            return folder / name
    return None


def find_idx_dataset(root: Optional[PathLike] = None, defaults: Optional[Sequence[PathLike]] = None,
                     name: str = "Fashion-MNIST") -> Path:
    """The folder holding the four IDX files: ``root`` if given, else the first of ``defaults`` that has them
    (default: :func:`fashion_mnist_dirs`, Debian's folder and then the user's data folder)."""
    if root is not None:
        candidates = [Path(root)]
    else:
        candidates = [Path(d) for d in (defaults if defaults is not None else fashion_mnist_dirs())]
    for folder in candidates:
        if all(_find(folder, stem) for pair in IDX_FILES.values() for stem in pair):
            return folder
    where = ", ".join(str(c) for c in candidates)
    if name == "Fashion-MNIST" and root is not None:
        fix = f"run `vitkit data fetch fashion-mnist --dir {root}` (no root needed), or pass the folder that holds them"
    elif name == "Fashion-MNIST":
        fix = (f"run `vitkit data fetch fashion-mnist` (downloads them into {data_home() / 'fashion-mnist'}, "
               f"no root needed), or `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or pass the "
               f"folder that holds them (--data fashion-mnist:DIR)")
    else:
        fix = f"pass the folder that holds them (--data {name.lower()}:DIR)"
    raise NotFoundError(f"{name} IDX files (train-images-idx3-ubyte[.gz] and the other three) not found in "
                        f"{where}", hint=fix)


def load_idx_split(split: str = "train", root: Optional[PathLike] = None,
                   defaults: Optional[Sequence[PathLike]] = None,
                   name: str = "Fashion-MNIST") -> Tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, H, W], labels int64 [N]) of the ``train`` or ``test`` split."""
    if split not in IDX_FILES:
        raise InputError(f"split must be 'train' or 'test', got {split!r}")
    folder = find_idx_dataset(root, defaults, name)
    img_stem, lbl_stem = IDX_FILES[split]
    images = read_idx(_find(folder, img_stem))
    labels = read_idx(_find(folder, lbl_stem)).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
    return images, labels


def load_fashion_mnist(split: str = "train", root: Optional[PathLike] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST from ``root``, else Debian's /usr/share/datasets/fashion-mnist or the user's data folder."""
    return load_idx_split(split, root)
