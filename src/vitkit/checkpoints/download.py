"""Fetching one weights file from a URL into a cache: progress, checksum, resume, atomic placement.

The HTTP client is the standard library's ``urllib``; this module only adds
what a multi-hundred-megabyte download needs:

- the bytes go to ``<file>.part`` next to the destination; an interrupted
  download keeps it, and the next attempt asks the server for the rest
  (``Range: bytes=N-``; a server that ignores it sends the whole file again);
- when the publisher states a SHA-256 (in full, or the prefix in a
  torchvision file name, ``vit_b_16-c867db91.pth``), the finished file is
  checked before it is renamed into place, so a bad file never sits in the cache;
- the rename is atomic: the destination either does not exist or is complete.

When the file cannot be fetched (offline, no network, a server error), the
error names the URL and the exact path to save the file at by hand.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Type

from ..errors import CheckpointError, NotFoundError, VitkitError
from ..utils import PathLike, exclusive
from ..version import __version__

CHUNK = 1 << 20
_HASH_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z0-9]+$")  # torch.hub's convention: name-<sha256 prefix>.ext
_RETRY_HTTP = {408, 425, 429, 500, 502, 503, 504}


class WeightsUnavailable(NotFoundError):
    """The weights are not on this machine and cannot be fetched now; the message says how to get them."""


def is_offline(offline: Optional[bool] = None) -> bool:
    """``offline`` when given, else the standard ``HF_HUB_OFFLINE`` variable (1 / true / yes / on)."""
    if offline is not None:
        return bool(offline)
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hash_from_name(url_or_name: str) -> Optional[str]:
    """The SHA-256 prefix a torchvision-style file name carries (``vit_b_16-c867db91.pth`` -> c867db91)."""
    m = _HASH_IN_NAME.search(url_or_name.split("?")[0].rsplit("/", 1)[-1])
    return m.group(1) if m else None


def sha256_of(path: PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def check_sha256(path: PathLike, expected: str, what: str) -> None:
    """Raise a ValueError if the file's SHA-256 does not start with ``expected`` (a full digest or a prefix)."""
    digest = sha256_of(path)
    if not digest.startswith(expected.lower()):
        raise CheckpointError(f"{what}: SHA-256 {digest[:16]}... does not match the published {expected[:16]}...: "
                              f"the file is corrupt or a different one")


def download_url(url: str, dst: PathLike, *, sha256: Optional[str] = None, progress: bool = True,
                 retries: int = 3, timeout: float = 60.0, offline: Optional[bool] = None,
                 unavailable: Type[NotFoundError] = WeightsUnavailable,
                 corrupt: Type[VitkitError] = CheckpointError) -> Path:
    """Download ``url`` to ``dst`` (resuming ``dst.part`` if one is there) and return ``dst``; an existing
    ``dst`` is returned as it is. Processes fetching the same ``dst`` wait for each other (a lock file in
    ``.locks/`` beside it).

    ``sha256``: the published digest or prefix (default: the one in the file name, if any); a mismatch
    deletes the download and raises ``corrupt`` (a ValueError for the default, CheckpointError). Network
    failures are retried ``retries`` times, each retry resuming where the last stopped; then ``unavailable``
    (default :class:`WeightsUnavailable`) says where to put the file. The two error types are the caller's
    kind of file (weights here, a dataset in :mod:`vitkit.data.fetch`).
    """
    dst = Path(dst).expanduser()
    part = dst.with_name(dst.name + ".part")
    expected = sha256 if sha256 is not None else hash_from_name(url)
    if is_offline(offline):
        raise unavailable(_manual(url, dst, "offline mode is on (--offline or HF_HUB_OFFLINE)"))
    dst.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(dst.parent / ".locks" / (dst.name + ".lock")):  # one download of a file at a time
        if dst.exists():  # another process fetched it while this one waited
            return dst
        _download(url, dst, part, expected, progress, retries, timeout, unavailable, corrupt)
    return dst


def _download(url: str, dst: Path, part: Path, expected: Optional[str], progress: bool, retries: int,
              timeout: float, unavailable: Type[NotFoundError], corrupt: Type[VitkitError]) -> None:
    attempt = 0
    while True:
        try:
            _fetch(url, part, progress, timeout)
            break
        except urllib.error.HTTPError as err:
            if err.code not in _RETRY_HTTP or attempt >= retries:
                raise unavailable(_manual(url, dst, f"the server answered HTTP {err.code} {err.reason}")) from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            if attempt >= retries:
                kept = part.stat().st_size if part.exists() else 0
                resume = f"; {kept:,} bytes kept in {part}, the next try resumes from there" if kept else ""
                reason = getattr(err, "reason", None) or err or type(err).__name__
                raise unavailable(_manual(url, dst, f"download failed ({reason}){resume}")) from None
        attempt += 1
        time.sleep(min(0.25 * 2 ** attempt, 4.0))
    if expected:
        try:
            check_sha256(part, expected, url)
        except ValueError as err:
            part.unlink()
            raise corrupt(f"{err}; the download was deleted, try again") from None
    os.replace(part, dst)


def _fetch(url: str, part: Path, progress: bool, timeout: float) -> None:
    """One request: the rest of ``part`` (or all of it) appended to ``part``."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": f"vitkit/{__version__}", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and have:  # the part is not a prefix the server can continue: start over
            part.unlink()
            return _fetch(url, part, progress, timeout)
        raise
    with resp:
        resumed = have and resp.status == 206 and _range_start(resp.headers.get("Content-Range")) == have
        if not resumed:
            have = 0
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        from tqdm.auto import tqdm
        with open(part, "ab" if resumed else "wb") as f, \
                tqdm(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                     desc=url.rsplit("/", 1)[-1][:40], disable=not progress, leave=False) as bar:
            while True:
                chunk = resp.read(CHUNK)
                if not chunk:
                    break
                f.write(chunk)
                bar.update(len(chunk))
    got = part.stat().st_size
    if total is not None and got != total:
        raise ConnectionError(f"connection closed after {got:,} of {total:,} bytes")


def _range_start(content_range: Optional[str]) -> Optional[int]:
    m = re.match(r"bytes (\d+)-", content_range or "")
    return int(m.group(1)) if m else None


def _manual(url: str, dst: Path, reason: str) -> str:
    return f"cannot download {url}: {reason}. Fetch it by other means and save it as {dst}"


__all__ = ["WeightsUnavailable", "check_sha256", "download_url", "hash_from_name", "is_offline", "sha256_of"]
