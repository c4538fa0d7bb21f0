"""IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed, read without trusting their headers."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import DataError, InputError, NotFoundError
from ..utils import PathLike

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot"]
MNIST_CLASSES = [str(i) for i in range(10)]
DEFAULT_FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


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


def find_idx_dataset(root: Optional[PathLike] = None, defaults: Sequence[str] = DEFAULT_FASHION_MNIST_DIRS,
                     name: str = "Fashion-MNIST") -> Path:
    """The folder holding the four IDX files: ``root`` if given, else the first default that has them."""
    candidates = [Path(root)] if root is not None else [Path(d) for d in defaults]
    for folder in candidates:
        if all(_find(folder, stem) for pair in _FILES.values() for stem in pair):
            return folder
    where = ", ".join(str(c) for c in candidates)
    raise NotFoundError(
        f"{name} IDX files (train-images-idx3-ubyte[.gz] and the other three) not found in {where}. "
        f"Get them with `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu; installs to "
        f"/usr/share/datasets/fashion-mnist) or download them from "
        f"https://github.com/zalandoresearch/fashion-mnist and pass the folder (e.g. --data "
        f"{name.lower()}:DIR)")


def load_idx_split(split: str = "train", root: Optional[PathLike] = None,
                   defaults: Sequence[str] = DEFAULT_FASHION_MNIST_DIRS) -> Tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, H, W], labels int64 [N]) of the ``train`` or ``test`` split."""
    if split not in _FILES:
        raise InputError(f"split must be 'train' or 'test', got {split!r}")
    folder = find_idx_dataset(root, defaults)
    img_stem, lbl_stem = _FILES[split]
    images = read_idx(_find(folder, img_stem))
    labels = read_idx(_find(folder, lbl_stem)).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
    return images, labels


def load_fashion_mnist(split: str = "train", root: Optional[PathLike] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST from ``root`` or Debian's /usr/share/datasets/fashion-mnist."""
    return load_idx_split(split, root)
