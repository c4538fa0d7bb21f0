"""Where weights named by a user come from: a path, a known name, a Hub repository or a URL.

:func:`resolve_weights` turns whatever ``-w`` / ``load_weights`` was given into
a local file or folder, looking first in the caches the other libraries
already fill, so a file is never stored twice:

- a file or folder on disk: itself;
- a known name (``vitkit weights``: ``torchvision/vit_b_16``,
  ``ViT_B_16_Weights.IMAGENET1K_V1``, ``vit_jax/ViT-B_16``, ``google/vit-base-patch16-224``, ...):
  its file, with the publisher's preprocessing, labels and checksum;
- a Hugging Face Hub repository (``google/vit-base-patch16-224``,
  ``hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k``, ``timm/NAME.TAG``,
  ``NAME.TAG``; ``@revision`` optional): its ``config.json`` and weights,
  through ``huggingface_hub`` and its cache (``HF_HOME`` / ``HF_HUB_CACHE``);
- a URL (``https://...``, ``gs://vit_models/...``) or a path inside the
  authors' bucket (``imagenet21k/ViT-B_16.npz``, ``augreg/NAME.npz``):
  downloaded into torch.hub's folder (``TORCH_HOME/hub/checkpoints``), where
  torchvision and timm keep theirs.

Offline (``offline=True``, ``--offline`` or ``HF_HUB_OFFLINE=1``) only the
caches are searched; a missing file raises :class:`WeightsUnavailable`
naming the URL and the path to save the file at.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import InputError, NotFoundError
from ..utils import PathLike
from .download import WeightsUnavailable, download_url, is_offline
from .registry import DEFAULT_CACHE, JAX, KNOWN, KnownCheckpoint, get_known

HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
HUB_OPTIONAL = ("preprocessor_config.json",)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TIMM_TAGGED = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")  # vit_base_patch16_224.augreg2_in21k_ft_in1k
_FILE_SUFFIXES = {"npz", "pth", "pt", "bin", "safetensors", "json", "ckpt"}
_OWN_PREFIXES = ("torchvision/", "vit_jax/", "hf/")
_JAX_FOLDERS = ("imagenet21k/", "imagenet21k+imagenet2012/", "augreg/", "sam/", "gsam/")


@dataclass
class Resolved:
    path: Path  # the local file or folder to read
    entry: Optional[KnownCheckpoint]  # the known checkpoint it is, if any
    origin: str  # what it was asked as: the path, name, Hub id or URL


def torch_cache() -> Path:
    """torch.hub's checkpoint folder (``TORCH_HOME/hub/checkpoints``), shared with torchvision and timm."""
    import torch.hub
    return Path(torch.hub.get_dir()) / "checkpoints"


def resolve_weights(name_or_path: PathLike, *, file: Optional[PathLike] = None,
                    cache_dir: Optional[PathLike] = None, offline: Optional[bool] = None,
                    progress: bool = True) -> Resolved:
    """The local file or folder for ``name_or_path``, fetched into a cache first when needed."""
    text = str(name_or_path).strip()
    entry = get_known(text)
    if file is not None:
        p = Path(file).expanduser()
        if not p.exists():
            raise NotFoundError(f"{p} (given for {text}) does not exist")
        return Resolved(p, entry, text)
    p = Path(text).expanduser()
    if p.exists():
        return Resolved(p, None, text)
    if entry is not None:
        return Resolved(fetch_known(entry, cache_dir, offline, progress), entry, text)
    url = as_url(text)
    if url is not None:
        dst = _cache_dirs(cache_dir)[0] / _cache_name(url)
        found = _cached(_cache_name(url), cache_dir)
        return Resolved(found or download_url(url, dst, progress=progress, offline=offline), None, text)
    repo = as_repo(text)
    if repo is not None:
        manual = _cache_dirs(cache_dir)[-1] / repo[0].replace("/", "--")
        if (manual / "config.json").is_file():  # the repository's files saved by hand
            return Resolved(manual, None, text)
        try:
            return Resolved(hub_folder(repo[0], repo[1], offline=offline, cache_dir=cache_dir, manual=manual),
                            None, text)
        except WeightsUnavailable as err:
            raise WeightsUnavailable(f"{text} is no file or folder here, nor a known name; as a Hugging Face Hub "
                                     f"repository: {err}{_hint(text)}") from None
    raise NotFoundError(_unknown(text))


# --- known checkpoints -------------------------------------------------------------
def fetch_known(entry: KnownCheckpoint, cache_dir, offline, progress) -> Path:
    """The local path of a known checkpoint's weights: the cached copy if there is one, else a download."""
    if entry.hub_repo:
        folder = entry.file.replace(".safetensors", "")
        legacy = _cached(folder, cache_dir)
        if legacy is not None and legacy.is_dir():  # the repository's files saved by hand
            return legacy
        single = _cached(entry.file, cache_dir) if entry.file.endswith(".safetensors") else None
        return single or hub_folder(entry.hub_repo, None, offline=offline, cache_dir=cache_dir,
                                    manual=_cache_dirs(cache_dir)[-1] / folder)
    found = _cached(entry.file, cache_dir)
    if found is not None:
        return found
    return download_url(entry.url, _cache_dirs(cache_dir)[0] / entry.file, sha256=entry.sha256, progress=progress,
                        offline=offline)


def _cache_dirs(cache_dir: Optional[PathLike]) -> List[Path]:
    """Where URL downloads are looked for, the first being where they go: ``cache_dir`` when given,
    else torch.hub's folder; vitkit's own older folder is still searched."""
    if cache_dir is not None:
        return [Path(cache_dir).expanduser()]
    return [torch_cache(), DEFAULT_CACHE.expanduser()]


def _cached(name: str, cache_dir: Optional[PathLike]) -> Optional[Path]:
    for folder in _cache_dirs(cache_dir):
        if (folder / name).exists():
            return folder / name
    return None


# --- URLs ---------------------------------------------------------------------------
def as_url(text: str) -> Optional[str]:
    """``text`` as an http(s) URL of a weights file, else None."""
    if text.startswith(("https://", "http://")):
        return text
    if text.startswith("gs://"):  # the authors' bucket is public over https
        return "https://storage.googleapis.com/" + text[len("gs://"):]
    if text.startswith(_JAX_FOLDERS) and text.endswith(".npz"):
        return JAX + text
    return None


def _cache_name(url: str) -> str:
    """The file name in the cache: the URL's last part, as torch.hub names it; the authors' fine-tuned
    files, which share names with the pre-trained ones, get their folder's suffix (``ViT-B_16-imagenet2012.npz``)."""
    base = url.split("?")[0].split("#")[0]
    if base.startswith(JAX + "imagenet21k+imagenet2012/"):
        stem = base.rsplit("/", 1)[-1][:-len(".npz")]
        return f"{stem}-imagenet2012.npz"
    name = base.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise InputError(f"{url} names no file")
    return name


# --- Hugging Face Hub ---------------------------------------------------------------
def as_repo(text: str) -> Optional[Tuple[str, Optional[str]]]:
    """(repo id, revision) for a Hub id, ``hf-hub:`` id, or a timm ``name.tag``; else None."""
    s = text[len("hf-hub:"):] if text.startswith("hf-hub:") else text
    s, _, rev = s.partition("@")
    if s.startswith(_OWN_PREFIXES):  # vitkit's own namespaces of known names: a typo, not a Hub id
        return None
    if _REPO.match(s) and s.rsplit(".", 1)[-1].lower() not in _FILE_SUFFIXES:
        return s, rev or None
    if _TIMM_TAGGED.match(s) and s.rsplit(".", 1)[-1] not in _FILE_SUFFIXES:
        return "timm/" + s, rev or None
    return None


def hub_folder(repo_id: str, revision: Optional[str] = None, *, offline: Optional[bool] = None,
               cache_dir: Optional[PathLike] = None, manual: Optional[Path] = None) -> Path:
    """The snapshot folder holding ``config.json`` and the weights of a Hub repository (downloaded
    through ``huggingface_hub`` into its cache, ``cache_dir`` if given, unless already there).
    ``manual``: the folder an error message tells the user to put the files in by hand."""
    manual = manual or DEFAULT_CACHE.expanduser() / repo_id.replace("/", "--")
    howto = (f"download config.json and model.safetensors from https://huggingface.co/{repo_id} into the "
             f"folder {manual}/ (or any folder, and pass that folder)")
    try:
        from huggingface_hub import hf_hub_download, hf_hub_url
        from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError:
        raise WeightsUnavailable(f"{repo_id} is a Hugging Face Hub repository and huggingface_hub is not installed: "
                                 f"pip install 'vitkit[hub]', or {howto}") from None
    kw = dict(revision=revision, local_files_only=is_offline(offline),
              cache_dir=str(cache_dir) if cache_dir is not None else None)

    def get(filename: str) -> str:
        try:
            return hf_hub_download(repo_id, filename, **kw)
        except (EntryNotFoundError, LocalEntryNotFoundError):
            raise
        except Exception as err:  # huggingface_hub's HTTP / repository / revision errors
            url = hf_hub_url(repo_id, filename, revision=revision)
            reason = str(err).strip().split("\n")[0]
            raise WeightsUnavailable(f"cannot download {url} ({type(err).__name__}: {reason}): {howto}") from None

    def missing(filename: str, err: Exception) -> WeightsUnavailable:
        url = hf_hub_url(repo_id, filename, revision=revision)
        why = ("offline mode is on (--offline or HF_HUB_OFFLINE) and it is not in the Hugging Face cache"
               if kw["local_files_only"] else str(err).strip().split("\n")[0])
        return WeightsUnavailable(f"cannot get {url}: {why}; {howto}")

    try:
        config = Path(get("config.json"))
    except (EntryNotFoundError, LocalEntryNotFoundError) as err:
        raise missing("config.json", err) from None
    first: Optional[Exception] = None
    for name in HUB_WEIGHTS:
        try:
            get(name)
            break
        except (EntryNotFoundError, LocalEntryNotFoundError) as err:
            first = first or err
    else:
        raise missing(HUB_WEIGHTS[0], first)
    for name in HUB_OPTIONAL:
        try:
            get(name)
        except (EntryNotFoundError, LocalEntryNotFoundError):
            pass
    return config.parent


def _hint(text: str) -> str:
    import difflib
    hint = difflib.get_close_matches(text, list(KNOWN), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(hint)}?)" if hint else ""


def _unknown(text: str) -> str:
    return (f"{text!r} is neither a file or folder, a known checkpoint name, a Hugging Face Hub id (org/name) nor "
            f"a URL{_hint(text)}: run 'vitkit weights' to list the known names")


__all__ = ["Resolved", "WeightsUnavailable", "hub_folder", "resolve_weights", "torch_cache"]
