"""One entry point for weights from anywhere: read, adapt, build; and the way back out.

``read_checkpoint(path)`` recognises the format from the contents and returns
a :class:`Checkpoint` in vitkit's layout. ``load_weights(name_or_path, ...)``
also adapts it to the model you ask for (resolution, classes, pre-logits; in
``vitkit.models.adapt``, the one place for that) and builds the model, or
returns ``(state, config)`` for a training engine. ``save_weights`` /
``convert`` write any format; converting A -> B -> A gives identical tensors.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from ..config import ViTConfig
from ..errors import CheckpointError, InputError, NotFoundError
from ..models import VisionTransformer
from ..models.adapt import adapt_state_dict, check_state_dict
from ..models.meta import ModelMeta
from ..utils import PathLike
from . import native
from .base import Checkpoint
from .detect import detect_layout
from .download import check_sha256
from .files import NPZ, read_json, read_tensors
from .formats import FORMATS, timm_folder
from .sources import resolve_weights
from .validate import validate_checkpoint

TARGETS = ("vitkit", "npz", "torchvision", "timm", "hf", "open_clip")
_KEEP = object()
DEFAULT_PRESET = {"torchvision": "torchvision", "timm": "timm", "npz": "authors", "hf": "hf", "hf_towers": "hf",
                  "open_clip": "clip"}
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_checkpoint(path: PathLike, *, num_heads: Optional[int] = None) -> Checkpoint:
    """Read weights in any supported format (recognised from the contents) as a vitkit-layout Checkpoint."""
    p = Path(path).expanduser()
    if not p.exists():
        raise NotFoundError("does not exist", path=p,
                            hint="read_checkpoint takes a local file or folder; load_weights also takes names and URLs")
    if p.is_dir():
        ckpt = _read_folder(p, num_heads)
    elif native.is_native(p) and p.name == native.WEIGHTS:
        ckpt = native.read_native(p.parent)
    else:
        ckpt = _read_file(p, num_heads)
    validate_checkpoint(ckpt)  # shapes, dtypes and finiteness against the config, for every format
    ckpt.layout.setdefault("source_format", ckpt.format)
    if ckpt.preprocessing is None and ckpt.format in DEFAULT_PRESET:
        from ..data.preprocess import get_preset
        ckpt.preprocessing = get_preset(DEFAULT_PRESET[ckpt.format], ckpt.config.img_size).to_dict()
    if ckpt.labels is None and ckpt.config.num_classes == 1000 and ckpt.format != "vitkit":
        from ..data.preprocess import imagenet_classes
        ckpt.labels = imagenet_classes()
        ckpt.notes.append("1000 classes and no names in the file: ImageNet-1k class names assumed")
    return ckpt


def _read_folder(p: Path, num_heads: Optional[int]) -> Checkpoint:
    if (p / native.META).is_file():  # a vitkit folder (read_native names what is wrong with a broken one)
        return native.read_native(p)
    if (p / "config.json").is_file():
        config = read_json(p / "config.json")
        tensors = _read_hf_weights(p)
        if timm_folder.is_timm_config(config):  # a timm Hub folder: timm names, timm's config.json
            return FORMATS["timm"].read_folder(tensors, config, num_heads=num_heads, source=str(p))
        fmt = "hf_towers" if FORMATS["hf_towers"].is_tower_config(config) else "hf"
        ckpt = FORMATS[fmt].read(tensors, config=config, num_heads=num_heads, source=str(p))
        pre = p / "preprocessor_config.json"
        if pre.is_file():
            ckpt.preprocessing = _hf_preprocessing(read_json(pre), ckpt) or ckpt.preprocessing
        return ckpt
    files = sorted(x.name for x in p.iterdir())[:12]
    raise CheckpointError(f"{p} is a folder but neither a vitkit checkpoint ({native.META}) nor a Hugging Face or timm "
                          f"one (config.json + model.safetensors); it holds {files}: pass the weights file itself")


def _read_hf_weights(p: Path) -> Dict[str, Any]:
    for name in HF_WEIGHTS:
        f = p / name
        if not f.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(read_json(f).get("weight_map", {}).values()))
            if not shards:
                raise CheckpointError(f"{f} lists no weight files")
            out: Dict[str, Any] = {}
            for shard in shards:
                out.update(read_tensors(p / shard)[1])
            return out
        return read_tensors(f)[1]
    raise FileNotFoundError(f"{p} has config.json but no weights: expected one of {', '.join(HF_WEIGHTS)}")


def _hf_preprocessing(pre: Dict[str, Any], ckpt: Checkpoint) -> Optional[Dict[str, Any]]:
    """The preset a ``preprocessor_config.json`` describes, as Hugging Face's processors run it:
    ``size`` {height, width} without a crop squashes to that size (ViTImageProcessor); with
    ``do_center_crop``, ``size`` {height, width} resizes to that square, ignoring the aspect ratio, and
    {shortest_edge} resizes the shorter side (BitImageProcessor), then ``crop_size`` is cut out with
    HF's offsets (``margin // 2``)."""
    from ..data.preprocess import get_preset
    size = pre.get("size") or {}
    if isinstance(size, (int, float)):  # an old-style plain number: a square (default_to_square)
        size = {"height": int(size), "width": int(size)}
    shortest = size.get("shortest_edge")
    h = size.get("height") or shortest
    w = size.get("width") or h
    if not h:
        return None
    base = get_preset("hf", (int(h), int(w)))
    crop = pre.get("crop_size") if pre.get("do_center_crop") else None
    if isinstance(crop, (int, float)):
        crop = {"height": int(crop), "width": int(crop)}
    extra: Dict[str, Any] = {}
    if isinstance(crop, dict) and crop.get("height"):
        ch, cw = int(crop["height"]), int(crop.get("width") or crop["height"])
        mode = "shorter" if shortest else "square"
        if not shortest and int(h) != int(w):  # a non-square resize before the crop: not a vitkit preset
            mode = "shorter"
            ckpt.notes.append(f"preprocessor_config.json resizes to {h}x{w} before its centre crop; vitkit "
                              f"resizes the shorter side to {min(h, w)} instead (the same on images of that shape)")
        extra = dict(name="hf-crop", size=(ch, cw), resize=int(shortest or min(h, w)), resize_mode=mode,
                     crop_rounding="floor", crop_pct=None,
                     description=f"Hugging Face {pre.get('image_processor_type', 'image processor')}")
    interp = FORMATS["hf"].RESAMPLE.get(pre.get("resample"), base.interpolation)
    return dataclasses.replace(base, mean=tuple(pre.get("image_mean", base.mean)), interpolation=interp,
                               std=tuple(pre.get("image_std", base.std)), **extra).to_dict()


def _read_file(p: Path, num_heads: Optional[int]) -> Checkpoint:
    kind, tensors, _meta = read_tensors(p)
    if kind == NPZ:
        return FORMATS["npz"].read(tensors, num_heads=num_heads, source=str(p))
    fmt = detect_layout(tensors, str(p))
    kwargs: Dict[str, Any] = {"num_heads": num_heads, "source": str(p)}
    if fmt in ("hf", "hf_towers"):
        sibling = p.with_name("config.json")
        if sibling.is_file():
            kwargs["config"] = read_json(sibling)
    return FORMATS[fmt].read(tensors, **kwargs)


# --- load into a model ------------------------------------------------------------
def load_weights(name_or_path: Union[str, PathLike], *, file: Optional[PathLike] = None,
                 model: Optional[VisionTransformer] = None, img_size: Union[None, int, Tuple[int, int]] = None,
                 num_classes: Optional[int] = None, labels: Optional[List[str]] = None,
                 representation_size: Any = _KEEP, head: str = "auto", resize: Optional[str] = None,
                 num_heads: Optional[int] = None, strict: bool = True, return_state: bool = False,
                 cache_dir: Optional[PathLike] = None, check_hash: bool = False, offline: Optional[bool] = None,
                 progress: bool = True, model_name: Optional[str] = None, **overrides: Any):
    """Load weights from a path (any format), a known name, a Hub id or a URL, adapted to the model you want.

    - ``name_or_path``: see :func:`vitkit.checkpoints.sources.resolve_weights`; what is not on disk
      is downloaded into the standard caches (``offline=True`` or ``HF_HUB_OFFLINE=1``: caches only).
      ``file`` gives the local file for a known name; ``check_hash`` re-checks a cached file against
      its published SHA-256 (downloads are always checked).
    - ``img_size``: build at another resolution; position tables are resized on
      the 2D grid with ``resize`` ("bilinear" = the authors' aligned-corners
      resize, the default; "bicubic" = timm / HF ``interpolate_pos_encoding``).
    - ``num_classes``: a new head, re-initialised to zeros (the paper's
      fine-tuning head); 0 drops it. ``labels`` names the new classes.
    - ``representation_size``: ``None`` drops a pre-logits layer (as the paper
      does for fine-tuning); by default it is kept as in the checkpoint.
    - ``model``: load into this existing model (its config is the target).
    - other keyword arguments override config fields (``drop_path=0.1``, ...).
    - ``strict``: missing, unexpected or mis-shaped keys raise, listed by name.
    - ``model_name``: the model the weights are for (``vit_base_patch16_clip_quickgelu_224``, a timm or
      Hub name): its config supplies what the keys cannot say (GELU flavour, LayerNorm epsilon, heads,
      position-table resize); a part the weights and the name disagree on raises, naming both
      (:mod:`vitkit.checkpoints.named`).

    Returns the model in eval mode, its :class:`~vitkit.models.meta.ModelMeta` (``model.meta``: labels,
    preprocessing for its resolution, format, source, notes) filled; with ``return_state=True`` returns
    ``(state_dict, config)`` instead.
    """
    ckpt = read_weights(name_or_path, file=file, num_heads=num_heads, cache_dir=cache_dir, check_hash=check_hash,
                        offline=offline, progress=progress)
    if model_name is not None:
        from .named import name_fields
        overrides = {**name_fields(model_name, ckpt), **overrides}
    return build(ckpt, model=model, img_size=img_size, num_classes=num_classes, labels=labels,
                 representation_size=representation_size, head=head, resize=resize, strict=strict,
                 return_state=return_state, **overrides)


def read_weights(name_or_path: Union[str, PathLike], *, file: Optional[PathLike] = None,
                 num_heads: Optional[int] = None, cache_dir: Optional[PathLike] = None, check_hash: bool = False,
                 offline: Optional[bool] = None, progress: bool = True) -> Checkpoint:
    """:func:`read_checkpoint` for anything :func:`load_weights` takes (fetched first when needed), with a
    known checkpoint's published preprocessing and labels."""
    where = resolve_weights(name_or_path, file=file, cache_dir=cache_dir, offline=offline, progress=progress)
    entry = where.entry
    if entry is not None and check_hash and entry.sha256 and where.path.is_file():
        check_sha256(where.path, entry.sha256, str(where.path))
    ckpt = read_checkpoint(where.path, num_heads=num_heads)
    if entry is not None:
        from ..data.preprocess import get_preset, imagenet_classes
        if entry.preset:  # else the folder's own config said it
            ckpt.preprocessing = get_preset(entry.preset, ckpt.config.img_size).to_dict()
        if entry.labels == "imagenet1k" and ckpt.config.num_classes == 1000 and ckpt.labels is None:
            ckpt.labels = imagenet_classes()
    if where.origin != str(where.path):
        ckpt.notes.insert(0, f"{where.origin} read from {where.path}")
    return ckpt


def load_model(path: PathLike, map_location: str = "cpu") -> VisionTransformer:
    """A saved model back (any format, usually a vitkit folder), on ``map_location``: :func:`load_weights`."""
    return load_weights(path).to(map_location)


def build(ckpt: Checkpoint, *, model: Optional[VisionTransformer] = None, img_size=None, num_classes=None,
          labels=None, representation_size: Any = _KEEP, head: str = "auto", resize: Optional[str] = None,
          strict: bool = True, return_state: bool = False, **overrides: Any):
    """Adapt a read Checkpoint to the target config and build the model (see :func:`load_weights`)."""
    src = ckpt.config
    if model is not None:
        target = model.config
    else:
        fields: Dict[str, Any] = dict(overrides)
        if img_size is not None:
            fields["img_size"] = img_size
        if num_classes is not None:
            fields["num_classes"] = num_classes
        if representation_size is not _KEEP:
            fields["representation_size"] = representation_size
        if resize is not None:
            fields["posemb_resize"] = resize
        target = src.replace(**fields) if fields else src
    state, notes = adapt_state_dict(ckpt.state, target, source_grid=src.grid_size, method=resize, head=head)
    m = model if model is not None else VisionTransformer(target)
    check_state_dict(state, m.state_dict(), ckpt.source or "weights", strict=strict)
    notes = ckpt.notes + notes
    if labels is not None and target.num_classes and len(labels) != target.num_classes:
        raise InputError(f"{len(labels)} labels given for a {target.num_classes}-class model")
    same_head = target.num_classes == src.num_classes and not any(n.startswith("head re-init") for n in notes)
    out_labels = list(labels) if labels is not None else (ckpt.labels if same_head else None)
    pre = _preprocessing_for(ckpt.preprocessing, target)
    if return_state:
        return state, target
    m.load_state_dict(state, strict=strict)
    m.meta = ModelMeta(labels=out_labels, preprocessing=pre, format=ckpt.format, source=ckpt.source,
                       layout=dict(ckpt.layout), notes=notes)
    return m.eval()


def _preprocessing_for(pre: Optional[Dict[str, Any]], cfg: ViTConfig) -> Optional[Dict[str, Any]]:
    if pre is None:
        return None
    from ..data.preprocess import get_preset
    return get_preset(pre, cfg.img_size).to_dict()


# --- write -----------------------------------------------------------------------
def checkpoint_of(model: VisionTransformer) -> Checkpoint:
    """A model as a Checkpoint (its labels, preprocessing and source layout kept)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    meta = model.meta
    return Checkpoint(state, model.config, "vitkit", labels=meta.labels, preprocessing=meta.preprocessing,
                      layout=dict(meta.layout), source=meta.source)


def save_weights(obj: Union[VisionTransformer, Checkpoint], dst: PathLike, to: str = "vitkit", *,
                 safetensors: bool = False, flavour: Optional[str] = None, prefix: Optional[str] = None) -> Path:
    """Write a model (or Checkpoint) in format ``to``: vitkit (folder), npz, torchvision / timm / open_clip (.pth,
    or .safetensors with ``safetensors=True``; open_clip: the image tower's state dict), hf (folder).
    ``flavour`` / ``prefix`` choose the npz layout
    ("vit_jax" or "big_vision"; e.g. "params/"); by default the layout it was read in is kept."""
    ckpt = obj if isinstance(obj, Checkpoint) else checkpoint_of(obj)
    to = to.lower()
    if to not in TARGETS:
        raise InputError(f"--to {to!r}: use one of {', '.join(TARGETS)}")
    dst = Path(dst).expanduser()
    safetensors = _check_name(dst, to, safetensors)
    if to == "vitkit":
        m = VisionTransformer(ckpt.config)
        check_state_dict(ckpt.state, m.state_dict(), ckpt.source or "weights")
        m.load_state_dict(ckpt.state)
        layout = dict(ckpt.layout)
        layout.setdefault("source_format", ckpt.format)
        return native.save_model(m, dst, labels=ckpt.labels, preprocessing=ckpt.preprocessing,
                                 extra={"source_layout": layout})
    writer = FORMATS[to].write
    kwargs: Dict[str, Any] = {}
    if to in ("torchvision", "timm", "open_clip"):
        kwargs["safetensors"] = safetensors
    if to == "npz":
        kwargs.update(flavour=flavour, prefix=prefix)
    return writer(ckpt, dst, **kwargs)


_TORCH_SUFFIXES = (".pth", ".pt", ".bin")
_FILE_SUFFIXES = _TORCH_SUFFIXES + (".safetensors", ".npz")


def _check_name(dst: Path, to: str, safetensors: bool) -> bool:
    """Whether to write safetensors: the file name's extension decides (``.safetensors``), and a name
    whose extension says another format than the one written is refused. Returns the safetensors flag."""
    suffix = dst.suffix.lower()
    if to in ("torchvision", "timm", "open_clip") and suffix == ".safetensors":
        return True
    if to in ("torchvision", "timm", "open_clip") and suffix in _TORCH_SUFFIXES and safetensors:
        raise InputError(f"{dst}: safetensors asked for, but {suffix} names a PyTorch pickle file; "
                         f"name the file {dst.with_suffix('.safetensors').name}")
    if (to == "npz") != (suffix == ".npz") and suffix in _FILE_SUFFIXES:
        raise InputError(f"{dst}: a {suffix} name for the {to} format; name it "
                         f"{dst.with_suffix('.npz' if to == 'npz' else '').name} or choose --to by the name")
    if to in ("vitkit", "hf") and suffix in _FILE_SUFFIXES:
        raise InputError(f"{dst}: the {to} format writes a folder (config and model.safetensors), not a "
                         f"{suffix} file; give a folder name such as {dst.with_suffix('').name}")
    return safetensors


def convert(src: PathLike, dst: PathLike, to: str = "vitkit", *, num_heads: Optional[int] = None,
            overwrite: bool = False, **kwargs: Any) -> Path:
    """Read ``src`` in any format and write it to ``dst`` in format ``to`` (no adaptation, exact tensors).
    An existing ``dst`` is refused unless ``overwrite``."""
    out = Path(dst).expanduser()
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists: choose another name, or pass --force (overwrite=True) "
                         f"to replace it")
    if out.exists() and Path(src).expanduser().resolve() == out.resolve():
        raise InputError(f"{out} is both the source and the destination: write to another name")
    return save_weights(read_checkpoint(src, num_heads=num_heads), out, to, **kwargs)


__all__ = ["TARGETS", "build", "checkpoint_of", "convert", "load_model", "load_weights", "read_checkpoint",
           "read_weights", "save_weights"]
