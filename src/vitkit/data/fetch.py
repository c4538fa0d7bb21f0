"""Datasets fetched into the user's data folder, no root needed: ``vitkit data fetch fashion-mnist``.

Fashion-MNIST's four gzip-compressed IDX files come from Zalando's server (or any mirror given as
``base_url``) into ``data_home()/fashion-mnist``, where :func:`vitkit.data.find_idx_dataset` looks after
Debian's folder. Each file goes through :func:`vitkit.checkpoints.download.download_url`: the bytes land in
``<file>.part`` (kept when the connection drops, resumed with a Range request on the next run), are checked
against the file's SHA-256, and only then renamed into place, so the folder never holds a partial or wrong
file under a real name. A file already there is checked again rather than fetched.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional

from ..checkpoints.download import check_sha256, download_url
from ..errors import DataError, NotFoundError
from ..utils import PathLike
from .idx import data_home, find_idx_dataset

FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"  # Zalando's README links here

# SHA-256 of the exact files served at FASHION_MNIST_URL (26,421,880 + 29,515 + 4,422,102 + 5,148 bytes).
# Cross-checked: each digest (and Zalando's published MD5) is reproduced byte for byte from Debian's
# dataset-fashion-mnist files, which hold the same gzip streams with the file name and time dropped from
# the gzip header (put back: name, and mtime 1504176606 for train, 1504176627 for t10k).
FASHION_MNIST_SHA256: Dict[str, str] = {
    "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
    "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
    "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
    "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
}
DATASETS = ("fashion-mnist",)


class DataUnavailable(NotFoundError):
    """A dataset file that cannot be downloaded now (no network, an HTTP error); the message names the URL
    and where to save the file by hand."""


def fetch_fashion_mnist(dest: Optional[PathLike] = None, *, base_url: str = FASHION_MNIST_URL,
                        sha256: Optional[Mapping[str, str]] = None, progress: bool = True,
                        retries: int = 3, timeout: float = 60.0) -> Path:
    """Download Fashion-MNIST's four IDX files into ``dest`` (default ``data_home()/fashion-mnist``), each
    checked against ``sha256`` (file name -> digest; default FASHION_MNIST_SHA256, the published files), and
    return the folder.

    Raises :class:`DataUnavailable` (a NotFoundError) when a file cannot be fetched, :class:`DataError` when
    one does not match its checksum (the download is deleted; a file already in ``dest`` that does not match
    is left for the user to look at and named in the message)."""
    folder = Path(dest).expanduser() if dest is not None else data_home() / "fashion-mnist"
    base = base_url if base_url.endswith("/") else base_url + "/"
    for name, digest in (FASHION_MNIST_SHA256 if sha256 is None else sha256).items():
        target = folder / name
        if target.is_file():
            try:
                check_sha256(target, digest, str(target))
            except ValueError as err:
                raise DataError(str(err), hint=f"delete {target} and fetch again") from None
            continue
        download_url(base + name, target, sha256=digest, progress=progress, retries=retries, timeout=timeout,
                     offline=False, unavailable=DataUnavailable, corrupt=DataError)
    return find_idx_dataset(folder)


__all__ = ["DATASETS", "DataUnavailable", "FASHION_MNIST_SHA256", "FASHION_MNIST_URL", "fetch_fashion_mnist"]
