"""The two kinds of labelled image dataset, one interface (``len``, ``labels``, ``classes``, ``channels``,
``gather``, ``subset``, ``in_memory``):

- :class:`TensorImages`: the whole split in memory as a uint8 tensor [N, C, H, W] (Fashion-MNIST, MNIST,
  CIFAR, small image folders, tensors you already have). Batches are gathered by indexing.
- :class:`FileImages`: a list of image files (or tar-shard members, see :mod:`vitkit.data.shards`) decoded
  on demand by loader workers to a fixed ``load_size`` square, for datasets that do not fit in memory.

The dataset sources (:mod:`vitkit.data.datasets`, :mod:`vitkit.data.shards`) build these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..errors import DataError


@dataclass
class TensorImages:
    """A labelled split held in memory: ``images`` uint8 [N, C, H, W], ``labels`` int64 [N]."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: List[str]
    name: str = "tensors"

    def __post_init__(self) -> None:
        if self.images.ndim == 3:  # [N, H, W] grayscale
            self.images = self.images.unsqueeze(1)
        if self.images.ndim != 4:
            raise DataError(f"{self.name}: images must be [N, C, H, W] (or [N, H, W]), got {tuple(self.images.shape)}")
        if self.images.dtype != torch.uint8:
            raise DataError(f"{self.name}: images must be uint8 (0..255), got {self.images.dtype}: "
                            f"convert with (x * 255).round().clamp(0, 255).to(torch.uint8)")
        self.labels = torch.as_tensor(self.labels, dtype=torch.int64)
        if self.labels.ndim != 1 or len(self.labels) != len(self.images):
            raise DataError(f"{self.name}: {len(self.images)} images but labels of shape {tuple(self.labels.shape)}")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DataError(f"{self.name}: labels must be in [0, {len(self.classes)}), got "
                             f"[{int(self.labels.min())}, {int(self.labels.max())}]")

    in_memory = True  # where the images live, stated by each dataset type: evaluation resizes them whole

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def channels(self) -> int:
        return int(self.images.shape[1])

    @property
    def image_size(self) -> Tuple[int, int]:
        return int(self.images.shape[2]), int(self.images.shape[3])

    def gather(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(images uint8 [len(index), C, H, W], labels [len(index)]) of these indices."""
        return self.images[index], self.labels[index]

    def subset(self, index: Sequence[int], name: Optional[str] = None) -> "TensorImages":
        """The images at ``index``, as a new dataset."""
        index = torch.as_tensor(index, dtype=torch.int64)
        return TensorImages(self.images[index], self.labels[index], self.classes, name or self.name)


@dataclass
class FileImages:
    """Images decoded on demand: ``items`` are (source, label) where source is a path or a
    :class:`~vitkit.data.shards.Member`. Each image is resized (shorter side) and centre-cropped
    to ``load_size`` so that batches stack; random crops then happen on the batch."""

    items: List[Tuple[Any, int]]
    classes: List[str]
    load_size: int = 256
    channels: int = 3
    name: str = "files"
    reader: Optional[Callable[[Any], bytes]] = field(default=None, repr=False)
    # Evaluation of a folder (vitkit eval): an unreadable image becomes a blank one with the label
    # -(index + 1), which evaluate() leaves out and reports, instead of stopping everything. Training keeps
    # the default: a bad file stops it with one line naming the file (a training set with holes would
    # silently change the run).
    skip_unreadable: bool = False

    in_memory = False  # decoded on demand, larger than the model: evaluation centre-crops them

    def __post_init__(self) -> None:
        self.labels = torch.tensor([lbl for _, lbl in self.items], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def image_size(self) -> Tuple[int, int]:
        return self.load_size, self.load_size

    def decode(self, i: int) -> torch.Tensor:
        """Image ``i`` decoded to uint8 [channels, load_size, load_size] (shorter side, centre crop)."""
        from PIL import Image

        src, _ = self.items[i]
        try:
            if self.reader is not None:
                import io
                img = Image.open(io.BytesIO(self.reader(src)))
            else:
                img = Image.open(src)
            img.load()
        except Exception as err:
            raise DataError(f"is not a readable image ({' '.join(str(err).split()) or type(err).__name__})",
                            path=src, hint=f"remove or replace the file ({self.name})") from None
        return fit_square(img, self.load_size, self.channels)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        if self.skip_unreadable:
            try:
                return self.decode(i), int(self.items[i][1])
            except DataError:
                return torch.zeros(self.channels, self.load_size, self.load_size, dtype=torch.uint8), -(i + 1)
        return self.decode(i), int(self.items[i][1])

    def gather(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(images uint8 [len(index), C, S, S], labels) of these indices, decoded now."""
        images, labels = zip(*(self[int(i)] for i in index))
        return torch.stack(images), torch.tensor(labels, dtype=torch.int64)

    def subset(self, index: Sequence[int], name: Optional[str] = None) -> "FileImages":
        """The images at ``index``, as a new dataset (nothing decoded)."""
        return FileImages([self.items[int(i)] for i in index], self.classes, self.load_size, self.channels,
                          name or self.name, self.reader, self.skip_unreadable)

    def to_memory(self) -> TensorImages:
        """Decode everything once (for small folders)."""
        images = torch.stack([self.decode(i) for i in range(len(self))]) if len(self) else \
            torch.zeros(0, self.channels, self.load_size, self.load_size, dtype=torch.uint8)
        return TensorImages(images, self.labels.clone(), self.classes, self.name)


def fit_square(img, load_size: int, channels: int) -> torch.Tensor:
    """A PIL image as uint8 [channels, load_size, load_size]: the shorter side resized (bilinear) to
    ``load_size``, then the centre square; how every decoded dataset brings its images to one size."""
    from PIL import Image

    img = img.convert("L" if channels == 1 else "RGB")
    w, h = img.size
    s = load_size / min(w, h)
    nw, nh = max(load_size, round(w * s)), max(load_size, round(h * s))
    img = img.resize((nw, nh), Image.BILINEAR)
    left, top = (nw - load_size) // 2, (nh - load_size) // 2
    img = img.crop((left, top, left + load_size, top + load_size))
    t = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())
    return t.unsqueeze(0) if t.ndim == 2 else t.permute(2, 0, 1)


Dataset = Union[TensorImages, FileImages]
