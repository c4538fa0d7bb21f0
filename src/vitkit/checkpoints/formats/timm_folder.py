"""timm's Hugging Face Hub folders: ``config.json`` + ``model.safetensors`` (or ``pytorch_model.bin``).

This is what ``timm.models.push_to_hf_hub`` / ``save_for_hf`` write and what a download of a
``timm/...`` repository gives: the weights in timm's own names (see :mod:`.timm`) and a
``config.json`` with the ``architecture`` (a timm model name), ``model_args`` (the keyword
arguments that differ from that architecture's defaults), ``global_pool``, the class names
(``label_names`` / ``label_descriptions``) and ``pretrained_cfg``, which holds the evaluation
preprocessing (``input_size``, ``interpolation``, ``crop_pct``, ``crop_mode``, ``mean``, ``std``).
Older folders put the ``pretrained_cfg`` fields at the top level; both are read.

Reading turns the preprocessing into the vitkit preset that computes what timm's
``create_transform(**resolve_data_config(model=...))`` computes: ``crop_mode="center"`` resizes
the shorter side to ``floor(size / crop_pct)`` and centre-crops, ``"squash"`` resizes both sides
to ``floor(size / crop_pct)`` and centre-crops. Writing gives a folder ``timm.create_model(
"local-dir:FOLDER", pretrained=True)`` builds and loads, with the checkpoint's preprocessing.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...errors import CheckpointError
from ...utils import write_json_atomic
from ..base import Checkpoint, layout_for
from ..files import write_safetensors

WEIGHTS = "model.safetensors"
FILE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".safetensors")
DEFAULT_CROP_PCT = 0.875  # timm's, for a pretrained_cfg without crop_pct
POOLS = {"token": "token", "avg": "gap", "map": "map"}
SIZE_FIELDS = ("width", "depth", "num_heads", "mlp_dim", "patch_size", "img_size", "num_classes")
# timm's extensions of the ViT, with the value that leaves them off: another value is not the paper's model
EXTENSIONS = {"qk_norm": False, "scale_attn_norm": False, "scale_mlp_norm": False, "proj_bias": True,
              "pool_include_prefix": False, "embed_norm_layer": None}
ALLOWED = {"pos_embed": ("learn", "none"), "act_layer": (None, "gelu", "quick_gelu", "gelu_tanh"),
           "norm_layer": (None, "layernorm")}
ACTS = {"gelu": "exact", "quick_gelu": "quick", "gelu_tanh": "tanh"}
# timm's keyword arguments for the descendants' parts -> vitkit config fields (their weights show the parts)
ARGS = {"init_values": lambda v: {"layer_scale": float(v)} if v else {},
        "reg_tokens": lambda v: {"reg_tokens": int(v)},
        "pre_norm": lambda v: {"norm_pre": bool(v)},
        "final_norm": lambda v: {} if v else {"final_norm": "none"},
        "fc_norm": lambda v: {"final_norm": "pooled"} if v else {},
        "no_embed_class": lambda v: {"posemb_class_slot": not v},
        "act_layer": lambda v: {"gelu": ACTS[v]} if v else {}}
# standard timm names by (width, depth, heads, mlp, patch, img): used as the architecture when they fit
SIZES = {(192, 12, 3, 768): "tiny", (384, 12, 6, 1536): "small", (768, 12, 12, 3072): "base",
         (1024, 24, 16, 4096): "large", (1280, 32, 16, 5120): "huge"}
TIMM_NAMES = {"vit_tiny_patch16_224", "vit_tiny_patch16_384", "vit_small_patch32_224", "vit_small_patch32_384",
              "vit_small_patch16_224", "vit_small_patch16_384", "vit_small_patch8_224", "vit_base_patch32_224",
              "vit_base_patch32_384", "vit_base_patch16_224", "vit_base_patch16_384", "vit_base_patch8_224",
              "vit_large_patch32_224", "vit_large_patch32_384", "vit_large_patch16_224", "vit_large_patch16_384",
              "vit_large_patch14_224", "vit_huge_patch14_224"}


def is_timm_config(config: Any) -> bool:
    """A timm folder's config.json names a timm ``architecture``; HF's has ``model_type``."""
    return isinstance(config, dict) and isinstance(config.get("architecture"), str) and "model_type" not in config


def split_config(config: Dict[str, Any]) -> Tuple[str, Dict[str, Any], Dict[str, Any]]:
    """(architecture, model_args, pretrained_cfg), for the current and the older single-dict layout."""
    arch = config["architecture"]
    if isinstance(config.get("pretrained_cfg"), dict):
        pc = dict(config["pretrained_cfg"])
        for key in ("label_names", "label_descriptions", "num_classes"):
            if key in config:
                pc[key] = config[key]
    else:  # older exports: the pretrained_cfg fields at the top level
        pc = {k: v for k, v in config.items() if k not in ("architecture", "num_features", "model_args")}
        if "labels" in pc:
            pc.setdefault("label_names", pc.pop("labels"))
    return arch, dict(config.get("model_args") or {}), pc


def model_fields(config: Dict[str, Any]) -> Tuple[Optional[int], Dict[str, Any], List[str]]:
    """(num_heads, config fields the weights do not show, notes) from a timm folder's config.json.

    The head count comes from ``model_args`` or the architecture's name; the read-out from
    ``global_pool``. Keyword arguments of timm's extensions (register tokens, layer scale, QK norm,
    pre-norm, ...) raise: those models are not the paper's ViT."""
    from ...config import ConfigError, parse_model_name
    arch, args, _ = split_config(config)
    bad = {k: v for k, v in args.items()
           if (k in ALLOWED and v not in ALLOWED[k]) or (k not in ALLOWED and k in EXTENSIONS and v != EXTENSIONS[k])}
    if bad:
        raise CheckpointError(f"timm model {arch} with {bad}: not the paper's ViT, vitkit cannot build it")
    notes: List[str] = []
    heads = args.get("num_heads")
    if heads is None:
        try:
            heads = parse_model_name(arch).get("num_heads")
        except ConfigError:
            notes.append(f"timm architecture {arch!r} is not a name vitkit knows: its shape is read from the "
                         f"weights")
    fields: Dict[str, Any] = {}
    from ...families import family_fields
    family = family_fields(arch)  # a descendant's timm name: its numerics (GELU, eps, layer scale, resize)
    if family:
        fields.update({k: v for k, v in family[1].items() if k not in SIZE_FIELDS})
    for key, convert in ARGS.items():
        if key in args:
            fields.update(convert(args[key]))
    pool = args.get("global_pool", config.get("global_pool"))
    if pool:
        if pool not in POOLS:
            raise CheckpointError(f"timm model {arch} pools with global_pool={pool!r}; vitkit reads out the class "
                                  f"token ('token'), the patch-token mean ('avg') or attention-pools them ('map')")
        fields["pool"] = POOLS[pool]
    for key in ("dynamic_img_size", "dynamic_img_pad"):
        if args.get(key):
            fields[key] = True
    return (int(heads) if heads else None), fields, notes


def image_size(config: Dict[str, Any]) -> Optional[Tuple[int, int]]:
    _, args, pc = split_config(config)
    size = args.get("img_size") or (pc.get("input_size") or [None])[1:]
    if isinstance(size, int):
        return size, size
    return (int(size[0]), int(size[1])) if size and len(size) == 2 else None


def labels(config: Dict[str, Any], num_classes: int) -> Optional[List[str]]:
    """Class names: ``label_descriptions`` of ``label_names`` where given (ImageNet synsets -> words)."""
    _, _, pc = split_config(config)
    names = pc.get("label_names")
    if isinstance(names, dict):
        names = [names.get(str(i), names.get(i, str(i))) for i in range(num_classes)]
    if not names or len(names) != num_classes:
        return None
    desc = pc.get("label_descriptions") or {}
    return [str(desc.get(n, n)) for n in names]


def preprocessing(config: Dict[str, Any], notes: List[str]) -> Optional[Dict[str, Any]]:
    """The preset computing timm's evaluation transform of this ``pretrained_cfg``."""
    from ...data.preprocess import Preset
    _, _, pc = split_config(config)
    size = image_size(config)
    if size is None:
        return None
    h, w = size
    crop_pct = float(pc.get("crop_pct") or DEFAULT_CROP_PCT)
    mode = pc.get("crop_mode") or "center"
    interp = pc.get("interpolation") or "bicubic"  # timm's default
    if interp not in ("bilinear", "bicubic", "nearest", "lanczos"):
        notes.append(f"timm interpolation {interp!r} read as bicubic")
        interp = "bicubic"
    scale = math.floor(min(h, w) / crop_pct)  # timm: floor(size / crop_pct) per side
    if mode not in ("center", "squash") or h != w:
        notes.append(f"timm crop_mode={mode!r} at {h}x{w}: vitkit resizes the shorter side to {scale} and "
                     f"centre-crops instead (timm's 'center' on square inputs)")
        mode = "center"
    mean, std = pc.get("mean") or (0.485, 0.456, 0.406), pc.get("std") or (0.229, 0.224, 0.225)
    return Preset(name="timm-cfg", size=(h, w), resize=scale, resize_mode="shorter" if mode == "center" else "square",
                  interpolation=interp, backend="pil", mean=tuple(mean), std=tuple(std), crop_pct=crop_pct,
                  description=f"timm pretrained_cfg (crop_mode {mode}, crop_pct {crop_pct})").to_dict()


# --- write ----------------------------------------------------------------------------
def is_folder(dst: Path) -> bool:
    """``--to timm`` writes a folder unless the destination is a weights file name."""
    return dst.is_dir() or dst.suffix.lower() not in FILE_SUFFIXES


def architecture(cfg) -> str:
    """A registered timm name for the model (the standard one when the sizes fit; model_args say the rest)."""
    mlp, p, img = cfg.mlp_dim, cfg.patch_size[0], cfg.img_size[0]
    if cfg.distill_token:
        size = SIZES.get((cfg.width, cfg.depth, cfg.num_heads, mlp), "base")
        return f"deit_{size if size in ('tiny', 'small', 'base') else 'base'}_distilled_patch16_224"
    from ...families import FAMILIES
    if cfg.name in FAMILIES and not cfg.name.count("/"):  # built as a descendant's timm name: that name
        return cfg.name
    if cfg.norm_pre:  # timm's CLIP towers: LayerNorm eps 1e-5 (model_args cannot say it), QuickGELU by name
        return "vit_base_patch16_clip_quickgelu_224" if cfg.gelu == "quick" else "vit_base_patch16_clip_224"
    size = SIZES.get((cfg.width, cfg.depth, cfg.num_heads, mlp))
    name = f"vit_{size}_patch{p}_{img}"
    return name if size and name in TIMM_NAMES else "vit_base_patch16_224"


def model_args(ckpt: Checkpoint) -> Dict[str, Any]:
    cfg = ckpt.config
    problems = []
    if cfg.backbone:
        problems.append("a hybrid's ResNet (write a .pth / .safetensors file instead)")
    if cfg.representation_size:
        problems.append("a pre-logits layer (timm's VisionTransformer has none; write a file, which keeps it)")
    if cfg.patch_size[0] != cfg.patch_size[1]:
        problems.append("square patches")
    ratio = cfg.mlp_dim / cfg.width
    if int(cfg.width * ratio) != cfg.mlp_dim:
        problems.append(f"an MLP width timm's mlp_ratio can express (got {cfg.mlp_dim} for width {cfg.width})")
    if cfg.patch_bias == cfg.norm_pre:
        problems.append("a patch-embedding bias exactly when there is no LayerNorm before the blocks (timm's pre_norm "
                        "drops the bias)")
    if problems:
        raise CheckpointError(f"a timm folder needs {'; '.join(problems)}")
    args: Dict[str, Any] = {
        "img_size": list(cfg.img_size), "patch_size": cfg.patch_size[0], "in_chans": cfg.in_chans,
        "num_classes": cfg.num_classes, "embed_dim": cfg.width, "depth": cfg.depth, "num_heads": cfg.num_heads,
        "mlp_ratio": ratio, "qkv_bias": cfg.qkv_bias, "class_token": cfg.class_token,
        "global_pool": {"token": "token", "gap": "avg", "map": "map"}[cfg.pool],
        "fc_norm": cfg.final_norm == "pooled", "final_norm": cfg.final_norm != "none",
        "act_layer": {v: k for k, v in ACTS.items()}[cfg.gelu], "pre_norm": cfg.norm_pre,
        "init_values": cfg.layer_scale, "reg_tokens": cfg.reg_tokens,
    }
    if cfg.posemb == "none":
        args["pos_embed"] = "none"
    if not cfg.posemb_class_slot or layout_for(ckpt, "timm").get("posemb_class_slot") is False:
        args["no_embed_class"] = True
    if cfg.dynamic_img_size:
        args["dynamic_img_size"] = True
    if cfg.dynamic_img_pad:
        args["dynamic_img_pad"] = True
    return args


def pretrained_cfg(ckpt: Checkpoint) -> Dict[str, Any]:
    """timm's evaluation settings for the checkpoint's preprocessing (exact for square sizes; a
    Hugging Face crop (offset ``margin // 2``) becomes timm's, which rounds)."""
    from ...data.preprocess import get_preset
    cfg = ckpt.config
    pre = get_preset(ckpt.preprocessing or "timm", cfg.img_size)
    size = pre.size[0]
    if pre.resize_mode == "squash":
        mode, crop_pct = "squash", 1.0
    else:
        mode = "center" if pre.resize_mode == "shorter" else "squash"
        # a crop_pct with floor(size / crop_pct) == resize, as round as possible
        tries = [pre.crop_pct, round(size / pre.resize, 4), size / pre.resize, size / (pre.resize + 0.5)]
        crop_pct = next(c for c in tries if c and math.floor(size / c) == pre.resize)
    return {"input_size": [cfg.in_chans, *cfg.img_size], "interpolation": pre.interpolation,
            "mean": list(pre.mean[:cfg.in_chans]), "std": list(pre.std[:cfg.in_chans]), "crop_pct": crop_pct,
            "crop_mode": mode,
            "num_classes": cfg.num_classes, "first_conv": "patch_embed.proj", "classifier": "head",
            "fixed_input_size": not cfg.dynamic_img_size, "custom_load": False}


def write(ckpt: Checkpoint, state: Dict[str, Any], dst: Path) -> Path:
    """A folder timm's ``create_model("local-dir:...")`` loads: model.safetensors (timm names) + config.json."""
    cfg = ckpt.config
    args = model_args(ckpt)
    config: Dict[str, Any] = {"architecture": architecture(cfg), "num_classes": cfg.num_classes,
                              "num_features": cfg.width, "global_pool": args["global_pool"]}
    if ckpt.labels and cfg.num_classes and len(ckpt.labels) == cfg.num_classes \
            and not all(re.match(r"^(LABEL_)?\d+$", str(x)) for x in ckpt.labels):
        config["label_names"] = list(ckpt.labels)
    config["model_args"] = args
    config["pretrained_cfg"] = pretrained_cfg(ckpt)
    folder = Path(dst)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(state, folder / WEIGHTS, metadata={"format": "pt"})
    write_json_atomic(folder / "config.json", config)
    return folder
