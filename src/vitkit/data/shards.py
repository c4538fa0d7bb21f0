"""Sharded tar datasets, WebDataset-style: many images per file, so large datasets are not millions of
small files.

Each shard is a plain tar archive. A sample is the group of members that share a key (the name up to
the first dot): ``000042.jpg`` (or .png/.webp...) holds the encoded image and ``000042.cls`` its class
index as text. A ``classes.txt`` beside the shards (one name per line) gives the label names.

Reading indexes each shard once (tar headers only) and then reads members by offset, so every loader
worker can fetch any sample: shuffling, distributed sharding and exact resume work as for any other
dataset. Keep the shards on local disk.
"""
from __future__ import annotations

import glob
import io
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import DataError, InputError, NotFoundError
from ..utils import atomic_path
from .images import FileImages, TensorImages
from .preprocess import IMAGE_EXTENSIONS

CLASSES_FILE = "classes.txt"


@dataclass(frozen=True)
class Member:
    shard: str
    offset: int
    size: int

    def __str__(self) -> str:
        return f"{self.shard}@{self.offset}"


def expand_pattern(pattern: str) -> List[str]:
    """``/data/train-{000..015}.tar`` -> 16 paths (brace range, zero padding kept); globs are expanded too."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", pattern)
    if m:
        lo, hi, width = int(m.group(1)), int(m.group(2)), len(m.group(1))
        out = []
        for i in range(lo, hi + 1):
            out += expand_pattern(pattern[:m.start()] + str(i).zfill(width) + pattern[m.end():])
        return out
    if any(c in pattern for c in "*?["):
        return sorted(glob.glob(pattern))
    return [pattern]


class _Reader:
    """Reads member bytes by offset; one open file per shard per process (safe across fork)."""

    def __init__(self) -> None:
        self._files: Dict[str, object] = {}
        self._pid = os.getpid()

    def __call__(self, m: Member) -> bytes:
        if os.getpid() != self._pid:  # a forked loader worker: reopen
            self._files, self._pid = {}, os.getpid()
        f = self._files.get(m.shard)
        if f is None:
            f = self._files[m.shard] = open(m.shard, "rb")
        f.seek(m.offset)
        return f.read(m.size)

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()


def index_shard(path: str) -> List[Tuple[Member, int]]:
    """(image member, label) for every complete sample in one shard."""
    images: Dict[str, Member] = {}
    labels: Dict[str, int] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                base = os.path.basename(info.name)
                key, _, ext = base.partition(".")
                key = os.path.join(os.path.dirname(info.name), key)
                ext = "." + ext.lower()
                if ext in IMAGE_EXTENSIONS:
                    images[key] = Member(path, info.offset_data, info.size)
                elif ext == ".cls":
                    f = tar.extractfile(info)
                    labels[key] = int(f.read().decode().strip())
    except (tarfile.TarError, OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable tar shard ({err})") from None
    return [(images[k], labels[k]) for k in sorted(images) if k in labels]


def tar_shards(pattern: str, *, load_size: int = 256, channels: int = 3,
               classes: Optional[List[str]] = None) -> FileImages:
    """The samples of all shards matching ``pattern`` as a :class:`FileImages` dataset."""
    paths = expand_pattern(pattern)
    missing = [p for p in paths if not os.path.isfile(p)]
    if not paths or missing:
        what = "missing " + ", ".join(missing[:3]) if missing else "no file matches"
        raise NotFoundError(f"tar shards {pattern!r}: {what} (write them with vitkit.data.shards.write_shards)")
    items: List[Tuple[Member, int]] = []
    for p in paths:
        items += index_shard(p)
    if not items:
        raise DataError(f"tar shards {pattern!r} hold no complete samples (KEY.jpg + KEY.cls)")
    if classes is None:
        names = Path(paths[0]).with_name(CLASSES_FILE)
        n = max(lbl for _, lbl in items) + 1
        classes = names.read_text().splitlines() if names.is_file() else [str(i) for i in range(n)]
    return FileImages(items, list(classes), load_size, channels, f"shards:{pattern}", _Reader())


def write_shards(data, pattern: str, *, per_shard: int = 10000, fmt: str = "png",
                 classes: Optional[Sequence[str]] = None) -> List[str]:
    """Write a dataset (a TensorImages, or an iterable of (uint8 [C,H,W] or PIL image, label)) to shards.

    ``pattern`` contains ``{shard}`` (e.g. ``/data/train-{shard}.tar``), replaced by a 6-digit number.
    Each shard is written atomically. Returns the written paths."""
    from PIL import Image

    if "{shard}" not in pattern:
        raise InputError("pattern must contain {shard}, e.g. /data/train-{shard}.tar")
    if fmt not in ("png", "jpg", "webp"):
        raise InputError(f"fmt={fmt!r}: use png (lossless), jpg or webp")
    if isinstance(data, TensorImages):
        classes = classes if classes is not None else data.classes
        samples: Iterable = ((data.images[i], int(data.labels[i])) for i in range(len(data)))
    else:
        samples = data
    written: List[str] = []
    tar, tmp_ctx, count, shard = None, None, 0, 0

    def close():
        nonlocal tar, tmp_ctx
        if tar is not None:
            tar.close()
            tmp_ctx.__exit__(None, None, None)
            tar = tmp_ctx = None

    for i, (img, label) in enumerate(samples):
        if tar is None or count == per_shard:
            close()
            path = pattern.replace("{shard}", f"{shard:06d}")
            tmp_ctx = atomic_path(path)
            tar = tarfile.open(tmp_ctx.__enter__(), "w")
            written.append(path)
            shard, count = shard + 1, 0
        if isinstance(img, torch.Tensor):
            arr = img.numpy()
            arr = arr[0] if arr.shape[0] == 1 else arr.transpose(1, 2, 0)
            img = Image.fromarray(np.ascontiguousarray(arr))
        buf = io.BytesIO()
        img.save(buf, format="JPEG" if fmt == "jpg" else fmt.upper())
        key = f"{i:09d}"
        for name, payload in ((f"{key}.{fmt}", buf.getvalue()), (f"{key}.cls", str(int(label)).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        count += 1
    close()
    if classes is not None and written:
        with atomic_path(Path(written[0]).with_name(CLASSES_FILE)) as tmp:
            tmp.write_text("\n".join(classes) + "\n")
    return written
