"""Any ``torch.utils.data.Dataset`` or Hugging Face ``datasets`` dataset as vitkit training or evaluation data.

:func:`from_dataset` wraps an indexable dataset whose items are ``(image, label)`` pairs (torchvision's
datasets, your own ``Dataset``) or dicts (``datasets``: ``{"image": PIL image, "label": int}``) into the
interface the training engine reads (:mod:`vitkit.data.datasets`: ``len``, ``labels``, ``classes``,
``channels``, ``gather``). Images may be PIL images, uint8 arrays / tensors ([H, W], [H, W, C] or
[C, H, W]) or float ones in [0, 1]; each is decoded on demand, by the loader's workers, to a fixed
``load_size`` square as image folders are (shorter side, centre crop), so random crops happen on the
batch. The labels are read once up front, from the dataset's own column where it has one (``targets``
of torchvision's datasets, the label column of ``datasets``), else by reading every item once.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import DataError
from .images import fit_square


class ExternalImages:
    """A dataset of another library, decoded item by item (see :func:`from_dataset`)."""

    in_memory = False

    def __init__(self, dataset: Any, labels: torch.Tensor, classes: List[str], load_size: int, channels: int,
                 image_key: str, label_key: str, name: str, index: Optional[Sequence[int]] = None):
        self.dataset, self.labels, self.classes = dataset, labels, classes
        self.load_size, self.channels, self.name = load_size, channels, name
        self.image_key, self.label_key = image_key, label_key
        self.index = list(range(len(dataset))) if index is None else [int(i) for i in index]

    def __len__(self) -> int:
        return len(self.index)

    @property
    def image_size(self) -> Tuple[int, int]:
        return self.load_size, self.load_size

    def _item(self, i: int) -> Tuple[Any, Any]:
        item = self.dataset[self.index[i]]
        if isinstance(item, dict):
            return item[self.image_key], item[self.label_key]
        return item[0], item[1]

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        image, _ = self._item(i)
        return fit_square(to_pil(image, f"{self.name}[{self.index[i]}]"), self.load_size, self.channels), \
            int(self.labels[i])

    def gather(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(images uint8 [len(index), C, S, S], labels) of these indices, decoded now."""
        images = [self[int(i)][0] for i in index]
        return torch.stack(images), self.labels[index]

    def subset(self, index: Sequence[int], name: Optional[str] = None) -> "ExternalImages":
        """The items at ``index``, as a new dataset over the same source (nothing decoded)."""
        index = [int(i) for i in index]
        return ExternalImages(self.dataset, self.labels[torch.as_tensor(index, dtype=torch.int64)], self.classes,
                              self.load_size, self.channels, self.image_key, self.label_key, name or self.name,
                              [self.index[i] for i in index])

    def to_memory(self):
        """Decode everything once (``data.cache``)."""
        from .images import TensorImages
        images = torch.stack([self[i][0] for i in range(len(self))]) if len(self) else \
            torch.zeros(0, self.channels, self.load_size, self.load_size, dtype=torch.uint8)
        return TensorImages(images, self.labels.clone(), self.classes, self.name)


def to_pil(image: Any, where: str = "image"):
    """A PIL image from a PIL image, or a uint8 / [0, 1] float array or tensor ([H, W], [H, W, C], [C, H, W])."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) and arr.shape[-1] not in (1, 3, 4):
        arr = arr.transpose(1, 2, 0)  # [C, H, W] -> [H, W, C]
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim not in (2, 3):
        raise DataError(f"{where}: an image must be [H, W], [H, W, C] or [C, H, W], got shape {arr.shape}")
    if arr.dtype != np.uint8:
        if not np.issubdtype(arr.dtype, np.floating):
            raise DataError(f"{where}: image values must be uint8 (0..255) or floats in [0, 1], got {arr.dtype}")
        arr = np.clip(np.round(arr * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def _labels_and_classes(dataset: Any, label_key: str,
                        classes: Optional[Sequence[str]]) -> Tuple[torch.Tensor, List[str]]:
    names = list(classes) if classes is not None else None
    features = getattr(dataset, "features", None)  # Hugging Face datasets
    if features is not None and label_key in features:
        labels = torch.as_tensor(np.asarray(dataset[label_key]), dtype=torch.int64)
        if names is None and hasattr(features[label_key], "names"):
            names = list(features[label_key].names)
    elif hasattr(dataset, "targets"):  # torchvision's datasets
        labels = torch.as_tensor(np.asarray(dataset.targets), dtype=torch.int64)
    else:  # read every item once
        labels = torch.tensor([int(item[label_key] if isinstance(item, dict) else item[1]) for item in
                               (dataset[i] for i in range(len(dataset)))], dtype=torch.int64)
    if names is None:
        names = [str(c) for c in getattr(dataset, "classes", [])] or \
            [str(i) for i in range(int(labels.max()) + 1 if len(labels) else 0)]
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(names)):
        raise DataError(f"labels must be in [0, {len(names)}) ({len(names)} classes), got "
                         f"[{int(labels.min())}, {int(labels.max())}]: pass classes=")
    return labels, names


def from_dataset(dataset: Any, *, classes: Optional[Sequence[str]] = None, load_size: int = 256,
                 channels: int = 3, image_key: str = "image", label_key: str = "label",
                 name: Optional[str] = None) -> ExternalImages:
    """``dataset`` (a ``torch.utils.data.Dataset`` of ``(image, label)``, or a Hugging Face ``datasets``
    split of ``{image_key: image, label_key: label}``) as vitkit data: pass it to
    ``Trainer(recipe, out, data={"train": ..., "test": ...})``. ``classes``: the class names (default: the
    dataset's own, else "0", "1", ...); images are decoded to ``load_size`` squares with ``channels``."""
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise DataError(f"{type(dataset).__name__} is not an indexable dataset (it needs __len__ and __getitem__; "
                         f"an IterableDataset cannot be split into training and validation images)")
    labels, names = _labels_and_classes(dataset, label_key, classes)
    return ExternalImages(dataset, labels, names, int(load_size), int(channels), image_key, label_key,
                          name or type(dataset).__name__)
