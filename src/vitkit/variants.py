"""Named variants: Table 1's sizes, the paper's and the hybrid models, registered names, and the parser that
turns a name such as ``B/16``, ``vit_base_patch16_224``, ``vit-b16`` or ``R50+B/16`` into config fields.

:func:`vitkit.config.config_from_name` builds a :class:`~vitkit.config.ViTConfig` from them.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Dict, Optional

from .errors import ConfigError

# Table 1 (B, L, H) plus the Ti and S sizes (DeiT / "How to train your ViT").
SIZES: Dict[str, Dict[str, int]] = {
    "Ti": dict(width=192, depth=12, mlp_dim=768, num_heads=3),
    "S": dict(width=384, depth=12, mlp_dim=1536, num_heads=6),
    "B": dict(width=768, depth=12, mlp_dim=3072, num_heads=12),
    "L": dict(width=1024, depth=24, mlp_dim=4096, num_heads=16),
    "H": dict(width=1280, depth=32, mlp_dim=5120, num_heads=16),
}
SIZE_ALIASES = {
    "ti": "Ti", "tiny": "Ti", "s": "S", "small": "S", "b": "B", "base": "B",
    "l": "L", "large": "L", "h": "H", "huge": "H",
}
# The patch sizes of the paper's models; any other positive size is accepted.
PAPER_MODELS = ("Ti/16", "S/32", "S/16", "B/32", "B/16", "B/8", "L/32", "L/16", "H/14")
# Hybrids (Section 3.1, Table 6): BiT ResNet + ViT on 1x1 patches of its feature map. "/16" keeps three
# stages (R50: stage 4's units moved into stage 3, (3, 4, 9)); "/32" keeps all four (stride 32).
HYBRID_MODELS = ("R26+S/32", "R26+B/32", "R50+B/16", "R50+B/32", "R50+L/32")
RESNET_DEPTHS = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


# --- registered names: filled by :func:`vitkit.config.register_model`, which checks the fields first ---------
REGISTERED: Dict[str, Dict[str, Any]] = {}


def list_models(pattern: Optional[str] = None) -> list:
    """Canonical names: the paper's models, the hybrids, the descendants (DeiT III, DINOv2, CLIP and SigLIP
    towers: :mod:`vitkit.families`), then registered ones; ``pattern`` keeps those
    matching a shell-style wildcard, case-insensitive (``"B/*"``, ``"*16"``, ``"R50*"``)."""
    from .families import FAMILIES
    names = list(PAPER_MODELS) + list(HYBRID_MODELS) + list(FAMILIES) + sorted(REGISTERED)
    if pattern is None:
        return names
    import fnmatch
    return [n for n in names if fnmatch.fnmatch(n.lower(), pattern.lower())]


_NAME_RE = re.compile(
    r"^(?P<size>ti|tiny|s|small|b|base|l|large|h|huge)\|?(?:patch\|?)?(?P<patch>\d+)"
    r"(?:\|(?P<res>\d+))?(?:\|(?:in21k|in1k|augreg|orig))*$")


def parse_model_name(name: str) -> Dict[str, Any]:
    """Turn a model name into config fields.

    Accepts ``B/16``, ``ViT-B/16``, ``ViT-B_16``, ``vit-b16``, ``vit_b_16``,
    ``vit_base_patch16_224``, ``google/vit-base-patch16-384`` and registered
    names; DeiT's ``deit_small_patch16_224`` (a ViT-S/16) and distilled
    ``deit_base_distilled_patch16_384`` / ``facebook/deit-tiny-distilled-patch16-224``
    (``distill_token=True``). Unknown names raise ConfigError with close suggestions.
    """
    if name in REGISTERED:
        return dict(REGISTERED[name], name=name)
    s = name.strip().lower()
    s = re.sub(r"^(google|facebook)/", "", s)
    hybrid = hybrid_match(s)  # before the descendants' table: no descendant's name is a hybrid's (tested)
    if hybrid:
        return _parse_hybrid(name, hybrid)
    from .families import family_fields
    family = family_fields(name)
    if family:
        return dict(family[1], name=family[0])
    deit = re.match(r"^deit[-_/ .]+(.+)$", s)
    if deit:  # DeiT's models are the ViT sizes; the distilled ones add the distillation token
        rest = re.sub(r"(^|[-_/ .])distilled(?=$|[-_/ .])", r"\1", deit.group(1))
        fields = parse_model_name("vit_" + rest)
        distilled = rest != deit.group(1)
        fields["name"] = "DeiT-" + fields["name"] + (" distilled" if distilled else "")
        if distilled:
            fields["distill_token"] = True
        return fields
    tokens = [t for t in re.split(r"[-_/ .]+", s) if t]
    if tokens and tokens[0] == "vit":
        tokens = tokens[1:]
    elif tokens and tokens[0].startswith("vit") and len(tokens[0]) > 3:
        tokens[0] = tokens[0][3:]
    m = _NAME_RE.match("|".join(tokens))
    if not m:
        known = list_models()
        lowered = {k.lower(): k for k in known}
        hint = difflib.get_close_matches(name.lower(), list(lowered), n=3, cutoff=0.4)
        sugg = f" Did you mean {', '.join(repr(lowered[h]) for h in hint)}?" if hint else ""
        raise ConfigError(
            f"unknown model name {name!r}.{sugg} Names look like 'B/16', 'vit_base_patch16_224' or "
            f"'vit-b16' (sizes Ti, S, B, L, H; any patch size); known: {', '.join(known)}")
    size = SIZE_ALIASES[m.group("size")]
    patch = int(m.group("patch"))
    fields = dict(SIZES[size], patch_size=patch, name=f"{size}/{patch}")
    if m.group("res"):
        res = int(m.group("res"))
        fields["img_size"] = res
        fields["name"] = f"{size}/{patch}@{res}"
    return fields


_HYBRID_RE = re.compile(r"^r(?P<depth>\d+)(?:x(?P<wf>\d+))?\+(?P<vit>.+)$")  # R50+B/16, R50x1+ViT-B_16
_TIMM_HYBRID_RE = re.compile(  # vit_base_r50_s16_224
    r"^vit_(?P<size>tiny|small|base|large|huge)_r(?P<depth>\d+)_s(?P<patch>\d+)(?:_(?P<res>\d+))?$")


def hybrid_match(name: str) -> Optional["re.Match"]:
    """The match of a (lower-case, organisation-free) name against the hybrid patterns (R50+B/16,
    vit_base_r50_s16_224), or None."""
    return _HYBRID_RE.match(name) or _TIMM_HYBRID_RE.match(name)


def _parse_hybrid(name: str, m: "re.Match") -> Dict[str, Any]:
    g = m.groupdict()
    vit = g.get("vit") or f"vit_{g['size']}_patch{g['patch']}" + (f"_{g['res']}" if g.get("res") else "")
    fields = parse_model_name(vit)
    depth, wf = int(g["depth"]), int(g.get("wf") or 1)
    if depth not in RESNET_DEPTHS:
        raise ConfigError(f"unknown hybrid {name!r}: ResNet depth {depth} is not one of "
                          f"{', '.join(map(str, RESNET_DEPTHS))} (names look like 'R50+B/16')")
    stride = fields["patch_size"]
    layers = RESNET_DEPTHS[depth]
    if stride == 16:  # the paper's variant: drop stage 4, move its units into stage 3
        layers = layers[:2] + (layers[2] + layers[3],)
    elif stride != 32:
        raise ConfigError(f"hybrid {name!r}: the ResNet gives /16 (three stages) or /32 (four stages), "
                          f"not /{stride}; for other strides set backbone_layers and patch_size yourself")
    size = fields["name"].split("/")[0]
    label = f"R{depth}{f'x{wf}' if wf != 1 else ''}+{size}/{stride}"
    if "img_size" in fields:
        label += f"@{fields['img_size']}"
    fields.update(patch_size=1, backbone="resnet", backbone_layers=layers, backbone_width=64 * wf, name=label)
    return fields


def architecture(cfg: Any) -> str:
    """A short name of ``cfg``'s architecture for people (page titles, model cards, export metadata):
    ``ViT-S/16 at 224x224 px`` where the sizes are one of Table 1's (or Ti/S), else the sizes themselves;
    a hybrid's ResNet as ``ResNet (3, 4, 9) + ...``."""
    dims = dict(width=cfg.width, depth=cfg.depth, mlp_dim=cfg.mlp_dim, num_heads=cfg.num_heads)
    size = next((k for k, v in SIZES.items() if v == dims), None)
    ph, pw = cfg.patch_size
    patch = str(ph) if ph == pw else f"{ph}x{pw}"
    body = (f"ViT-{size}/{patch}" if size else
            f"ViT (width {cfg.width}, depth {cfg.depth}, {cfg.num_heads} heads, MLP {cfg.mlp_dim}, patch {patch})")
    if cfg.backbone:
        body = f"ResNet {tuple(cfg.backbone_layers)} + {body}"
    return f"{body} at {cfg.img_size[0]}x{cfg.img_size[1]} px"
