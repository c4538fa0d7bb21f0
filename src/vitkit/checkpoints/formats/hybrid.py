"""The hybrid's BiT ResNet in the foreign layouts that have it: the authors' ``.npz`` and timm.

Not a format of its own: :mod:`.npz` and :mod:`.timm` add these rules to
their ViT rules when a file (or a model) has a backbone. The rules are
generated for the stages and units present, since the key map's ``{i}``
stands for one index only.

authors' npz (``R50+ViT-B_16.npz``, AugReg ``R26_S_32-...npz``)::

    conv_root/kernel [7, 7, C, w]   gn_root/{scale,bias}
    block{s}/unit{u}/conv{1,2,3}/kernel (HWIO), gn{1,2,3}/{scale,bias},
    block{s}/unit1/conv_proj/kernel, gn_proj/{scale,bias}        (s, u from 1)

timm (``vit_base_r50_s16_224`` ...), below ``patch_embed.backbone.``::

    stem.conv.weight, stem.norm.{weight,bias}      (root-only models: conv / norm)
    stages.{s}.blocks.{u}.conv{1,2,3}.weight, norm{1,2,3}.{weight,bias},
    stages.{s}.blocks.0.downsample.conv.weight, downsample.norm.{weight,bias}   (s, u from 0)

The numerics differ: the authors' Flax code standardises kernels as
(w - mean) / (std + 1e-5) with GroupNorm eps 1e-6, timm as
(w - mean) / sqrt(var + 1e-8) with GroupNorm eps 1e-5. A checkpoint read
from either gets its own in the config, so logits match its source.
"""
from __future__ import annotations

import re
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ...errors import CheckpointError
from ..keymap import CONV_HWIO, COPY, Rule, rule

BACKBONE = "patch_embed.backbone."
NUMERICS = {
    "npz": dict(std_conv_style="std", std_conv_eps=1e-5, gn_eps=1e-6),
    "timm": dict(std_conv_style="var", std_conv_eps=1e-8, gn_eps=1e-5),
}
_UNIT = {  # format -> regex over a foreign key giving (stage, unit) and the index base
    "npz": (re.compile(r"(?:^|/)block(\d+)/unit(\d+)/conv1/kernel$"), 1),
    "timm": (re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.conv1\.weight$"), 0),
}
_ROOT = {"npz": "conv_root/kernel",
         "timm": ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.conv.weight")}
_OURS_UNIT = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.(\d+)\.conv1\.weight$")


def _layers_from(keys: Iterable[str], rx: "re.Pattern", base: int) -> Tuple[int, ...]:
    units: Dict[int, int] = {}
    for k in keys:
        m = rx.search(k)
        if m:
            s, u = int(m.group(1)) - base, int(m.group(2)) - base
            units[s] = max(units.get(s, 0), u + 1)
    if sorted(units) != list(range(len(units))):
        raise CheckpointError(f"the ResNet stages in the weights are not numbered consecutively: {sorted(units)}")
    return tuple(units[s] for s in range(len(units)))


def foreign_layers(keys: Iterable[str], fmt: str) -> Optional[Tuple[int, ...]]:
    """Units per stage of the backbone stored in foreign ``keys`` (() = root only); None: not a hybrid."""
    keys = list(keys)
    roots = _ROOT[fmt] if isinstance(_ROOT[fmt], tuple) else (_ROOT[fmt],)
    if not any(k in keys for k in roots):
        return None
    rx, base = _UNIT[fmt]
    return _layers_from(keys, rx, base)


def backbone_rules(fmt: str, layers: Tuple[int, ...]) -> List[Rule]:
    """Rules between vitkit's backbone keys and ``fmt``'s, for ``layers`` units per stage."""
    ours = BACKBONE
    out: List[Rule] = []
    if fmt == "npz":
        def conv(o, t):
            out.append(rule(f"{ours}{o}.weight", f"{t}/kernel", CONV_HWIO))

        def gn(o, t):
            out.extend([rule(f"{ours}{o}.weight", f"{t}/scale"), rule(f"{ours}{o}.bias", f"{t}/bias")])
        conv("conv_root", "conv_root")
        gn("gn_root", "gn_root")
        for s, n in enumerate(layers):
            for u in range(n):
                o, t = f"stages.{s}.{u}.", f"block{s + 1}/unit{u + 1}/"
                for r in (1, 2, 3):
                    conv(f"{o}conv{r}", f"{t}conv{r}")
                    gn(f"{o}gn{r}", f"{t}gn{r}")
                if u == 0:
                    conv(f"{o}conv_proj", f"{t}conv_proj")
                    gn(f"{o}gn_proj", f"{t}gn_proj")
        return out
    if fmt == "timm":
        def same(o, t, params=("weight",)):
            out.extend(rule(f"{ours}{o}.{p}", f"{BACKBONE}{t}.{p}", COPY) for p in params)
        root = "stem." if layers else ""  # timm builds a root-only backbone as the bare stem
        same("conv_root", root + "conv")
        same("gn_root", root + "norm", ("weight", "bias"))
        for s, n in enumerate(layers):
            for u in range(n):
                o, t = f"stages.{s}.{u}.", f"stages.{s}.blocks.{u}."
                for r in (1, 2, 3):
                    same(f"{o}conv{r}", f"{t}conv{r}")
                    same(f"{o}gn{r}", f"{t}norm{r}", ("weight", "bias"))
                if u == 0:
                    same(f"{o}conv_proj", f"{t}downsample.conv")
                    same(f"{o}gn_proj", f"{t}downsample.norm", ("weight", "bias"))
        return out
    raise CheckpointError(f"{fmt} has no hybrid ResNet+ViT layout: write hybrids as vitkit, npz or timm")


def read_rules(keys: Iterable[str], fmt: str) -> Tuple[List[Rule], Dict[str, Any]]:
    """(extra rules, config fields with the source's numerics) for the foreign keys; ([], {}) if no backbone."""
    layers = foreign_layers(keys, fmt)
    if layers is None:
        return [], {}
    return backbone_rules(fmt, layers), dict(NUMERICS[fmt])


def write_rules(cfg, fmt: str) -> List[Rule]:
    """Extra rules to write ``cfg``'s backbone in ``fmt`` (none for a pure ViT). Warns when the target computes
    with other numerics than the model (tensors are still copied exactly)."""
    if not cfg.backbone:
        return []
    if fmt not in NUMERICS:
        raise CheckpointError(f"{fmt} has no hybrid ResNet+ViT layout: write hybrids as vitkit, npz or timm")
    if (cfg.backbone_stem, cfg.backbone_unit) != ("bit", "bottleneck"):
        raise CheckpointError(f"{fmt} holds BiT ResNets only (7x7 root, bottleneck units); this model's has the "
                              f"{cfg.backbone_stem!r} root and {cfg.backbone_unit!r} units: write it as vitkit")
    want = NUMERICS[fmt]
    have = {k: getattr(cfg, k) for k in want}
    if have != want:
        warnings.warn(f"{fmt} computes the ResNet with {want}; this model uses {have}, so its logits there will "
                      f"differ slightly (the tensors themselves are copied exactly)", stacklevel=3)
    return backbone_rules(fmt, cfg.backbone_layers)


def backbone_fields(state: Dict[str, Any]) -> Dict[str, Any]:
    """Config fields implied by a vitkit-keyed state with a backbone (shapes only); {} for a pure ViT."""
    root = state.get(BACKBONE + "conv_root.weight")
    if root is None:
        return {}
    basic = "patch_embed.backbone.stages.0.0.conv1.weight" in state and \
        "patch_embed.backbone.stages.0.0.conv3.weight" not in state  # ResNet-18/34 units have two convolutions
    return dict(backbone="resnet", backbone_layers=_layers_from(state, _OURS_UNIT, 0),
                backbone_width=int(root.shape[0]), in_chans=int(root.shape[1]),
                backbone_stem="3x3" if root.shape[-1] == 3 else "bit", backbone_unit="basic" if basic else "bottleneck")

