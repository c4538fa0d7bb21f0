"""The ViT's descendants by name: DeiT III, DINOv2 (with registers), CLIP and SigLIP image towers.

Each is the paper's ViT with a handful of config fields set (layer scale, register tokens, a LayerNorm
before the blocks, QuickGELU, attention pooling, ...): data, not classes. Names are timm's (the image
tower a ``timm.create_model`` call builds, with its defaults: resolution, head size, numerics) and the
Hugging Face Hub ids of the published towers (with transformers' numerics, e.g. SigLIP's tanh GELU).
:func:`vitkit.config.parse_model_name` reads them; :func:`vitkit.list_models` lists them.
"""
from __future__ import annotations

from typing import Any, Dict

# width, depth, heads, MLP width of the sizes these families use (timm's names)
DIMS = {
    "small": (384, 12, 6, 1536), "medium": (512, 12, 8, 2048), "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096), "huge": (1280, 32, 16, 5120), "so400m": (1152, 27, 16, 4304),
}
# timm resizes position tables bicubically with antialiasing (``resample_abs_pos_embed``)
_TIMM_RESIZE = dict(posemb_resize="bicubic", posemb_antialias=True)
_HF_RESIZE = dict(posemb_resize="bicubic", posemb_antialias=False)  # interpolate_pos_encoding
# DeiT III (Touvron et al. 2022): LayerScale, no slot for the class token in the position table
DEIT3 = dict(layer_scale=1e-6, posemb_class_slot=False, **_TIMM_RESIZE)
DINOV2 = dict(layer_scale=1e-5, num_classes=0)  # DINOv2 (Oquab et al. 2023): LayerScale, a feature extractor
CLIP = dict(norm_pre=True, patch_bias=False, ln_eps=1e-5, **_TIMM_RESIZE)  # ln_pre, no patch bias, eps 1e-5
SIGLIP = dict(class_token=False, pool="map", num_classes=0, **_TIMM_RESIZE)  # MAP head, no class token


def _dims(size: str, patch: int, img: int) -> Dict[str, Any]:
    width, depth, heads, mlp = DIMS[size]
    return dict(width=width, depth=depth, num_heads=heads, mlp_dim=mlp, patch_size=patch, img_size=img)


def _remainder(patch: int, img: int) -> Dict[str, Any]:
    """384 px in 14 px patches (so400m): 27 patches a side, the last 6 pixels not read (timm's and HF's
    convolution)."""
    return dict(crop_remainder=True) if img % patch else {}


def _table() -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for size, patch, img in (("small", 16, 224), ("small", 16, 384), ("medium", 16, 224), ("base", 16, 224),
                             ("base", 16, 384), ("large", 16, 224), ("large", 16, 384), ("huge", 14, 224)):
        out[f"deit3_{size}_patch{patch}_{img}"] = dict(_dims(size, patch, img), **DEIT3)
    for size in ("small", "base", "large"):
        out[f"vit_{size}_patch14_dinov2"] = dict(_dims(size, 14, 518), **DINOV2, **_TIMM_RESIZE)
        out[f"vit_{size}_patch14_reg4_dinov2"] = dict(_dims(size, 14, 518), **DINOV2, **_TIMM_RESIZE, reg_tokens=4,
                                                       posemb_class_slot=False)
    # timm's CLIP towers: the head size of each name's default weights (ImageNet fine-tunes: 1000 classes;
    # the QuickGELU ones: the CLIP projection as a head)
    for size, patch, img, quick_classes in (("base", 32, 224, 512), ("base", 16, 224, 512),
                                            ("large", 14, 224, 768), ("large", 14, 336, 768), ("huge", 14, 224, None)):
        out[f"vit_{size}_patch{patch}_clip_{img}"] = dict(_dims(size, patch, img), **CLIP, num_classes=1000)
        if quick_classes:
            out[f"vit_{size}_patch{patch}_clip_quickgelu_{img}"] = dict(
                _dims(size, patch, img), **CLIP, gelu="quick", num_classes=quick_classes)
    for size, patch, img in (("base", 16, 224), ("base", 16, 256), ("base", 16, 384), ("base", 16, 512),
                             ("large", 16, 256), ("large", 16, 384), ("so400m", 14, 224), ("so400m", 14, 384)):
        out[f"vit_{size}_patch{patch}_siglip_{img}"] = dict(_dims(size, patch, img), **SIGLIP, **_remainder(patch, img))
    # Hugging Face Hub towers (transformers' numerics; CLIPVisionModel's last hidden state is not normalised)
    for size in ("small", "base", "large"):
        out[f"facebook/dinov2-{size}"] = dict(_dims(size, 14, 518), **DINOV2, **_HF_RESIZE, ln_eps=1e-6)
        out[f"facebook/dinov2-with-registers-{size}"] = dict(_dims(size, 14, 518), **DINOV2, **_HF_RESIZE,
                                                             reg_tokens=4)
    for size, patch, img in (("base", 32, 224), ("base", 16, 224), ("large", 14, 224), ("large", 14, 336)):
        name = f"openai/clip-vit-{size}-patch{patch}" + ("-336" if img == 336 else "")
        out[name] = dict(_dims(size, patch, img), norm_pre=True, patch_bias=False, ln_eps=1e-5, gelu="quick",
                         final_norm="pooled", num_classes=0, **_HF_RESIZE)
    for size, patch, img in (("base", 16, 224), ("base", 16, 256), ("base", 16, 384), ("base", 16, 512),
                             ("large", 16, 256), ("large", 16, 384)):
        out[f"google/siglip-{size}-patch{patch}-{img}"] = dict(_dims(size, patch, img), **SIGLIP, gelu="tanh")
        out[f"google/siglip-{size}-patch{patch}-{img}"].update(_HF_RESIZE)
    out["google/siglip-so400m-patch14-384"] = dict(_dims("so400m", 14, 384), **SIGLIP, gelu="tanh",
                                                   **_remainder(14, 384))
    out["google/siglip-so400m-patch14-384"].update(_HF_RESIZE)
    return out


FAMILIES: Dict[str, Dict[str, Any]] = _table()
_LOWER = {k.lower(): k for k in FAMILIES}


def family_fields(name: str):
    """(canonical name, config fields) of a descendant's name (case-insensitive), or None."""
    key = _LOWER.get(name.strip().lower())
    return (key, dict(FAMILIES[key])) if key else None
