"""The model's intermediates and timm's model interface: :class:`TimmInterface`, mixed into
:class:`~vitkit.models.vit.VisionTransformer`, so timm code runs unchanged on a vitkit model
(``num_features``, ``embed_dim``, ``num_prefix_tokens``, ``feature_info``, ``get_classifier``,
``reset_classifier``, ``prune_intermediate_layers``, ``forward_intermediates`` with timm's defaults and return
shape, and a ``pretrained_cfg`` from ``model.meta`` so ``timm.data.resolve_model_data_config`` returns the
model's own preprocessing), plus the helpers behind them: choose the blocks, lay their tokens out as timm does,
scale them into a pyramid."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from .meta import AUTHORS_PREPROCESSING

Grid = Tuple[int, int]


def resolve_indices(indices: Union[None, int, Sequence[int]], depth: int) -> List[int]:
    """Sorted block indices: None for every block, an int n for the last n, or a list (negative indices count
    from the end)."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise InputError(f"asked for the last {indices} blocks of a {depth}-block model")
        return list(range(depth - indices, depth))
    out = []
    for i in indices:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise InputError(f"block index {i} is out of range for a {depth}-block model")
        out.append(j)
    return sorted(set(out))


def check_output_fmt(output_fmt: str) -> None:
    if output_fmt not in ("NCHW", "NLC", "dict"):
        raise InputError(f"output_fmt={output_fmt!r}: use 'NCHW' (maps), 'NLC' (token sequences) or 'dict' "
                         f"(vitkit's dict of every block's tokens and attention maps)")


def timm_layout(tokens: List[torch.Tensor], grid: Grid, num_prefix_tokens: int, output_fmt: str,
                return_prefix_tokens: bool = False) -> list:
    """Each [B, prefix + N, D] token sequence as its patch tokens, a map [B, D, rows, cols] ("NCHW") or
    [B, N, D] ("NLC"), paired with its prefix tokens [B, prefix, D] as ``(map, prefix)`` when
    ``return_prefix_tokens`` (and the model has prefix tokens)."""
    p = num_prefix_tokens
    out = [y[:, p:] for y in tokens]
    if output_fmt == "NCHW":
        out = [y.reshape(y.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous() for y in out]
    if return_prefix_tokens and p:
        out = [(y, t[:, :p]) for y, t in zip(out, tokens)]
    return out


def feature_pyramid(maps: List[torch.Tensor], scales: Sequence[float]) -> List[torch.Tensor]:
    """One scale per map [B, D, rows, cols]: up by bilinear interpolation, down (1/k for a whole k) by average
    pooling; 1 leaves the map as it is."""
    if len(scales) != len(maps):
        raise InputError(f"{len(scales)} scales for {len(maps)} feature maps: give one per map")
    out = []
    for m, s in zip(maps, scales):
        if s > 1:
            m = F.interpolate(m, scale_factor=float(s), mode="bilinear", align_corners=False)
        elif s < 1:
            k = round(1 / s)
            if abs(k * s - 1) > 1e-9:
                raise InputError(f"scale {s}: a down-scale must be 1/k for a whole k")
            m = F.avg_pool2d(m, k, ceil_mode=True)
        out.append(m)
    return out


def timm_data_config(config, preprocessing: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """timm's ``pretrained_cfg`` data fields for a model of ``config`` whose weights came with ``preprocessing``
    (a Preset as a dict; None: the default, the paper authors' pipeline, marked ``default_preprocessing``)."""
    pre = dict(preprocessing or AUTHORS_PREPROCESSING)
    h, w = config.img_size
    squash = pre.get("resize_mode") == "squash"
    crop = 1.0 if squash else pre.get("crop_pct") or min(h, w) / float(pre.get("resize") or min(h, w))
    return {"input_size": (config.in_chans, h, w), "interpolation": pre.get("interpolation", "bilinear"),
            "mean": tuple(pre["mean"]), "std": tuple(pre["std"]), "crop_pct": crop,
            "crop_mode": "squash" if squash else "center", "default_preprocessing": preprocessing is None}


class TimmInterface:
    """What timm code expects of a model (mixed into VisionTransformer, which provides ``config``, ``meta``,
    ``blocks``, ``norm``, ``head`` and the forward pieces)."""

    @property
    def embed_dim(self) -> int:
        """The width D of the token embeddings."""
        return self.config.width

    @property
    def num_features(self) -> int:
        """Channels of the pooled features the head reads (timm: the embedding width)."""
        return self.config.width

    @property
    def head_hidden_size(self) -> int:
        """Channels of the vector the classifier reads (the pre-logits layer's, where there is one)."""
        return self.config.representation_size or self.config.width

    @property
    def num_prefix_tokens(self) -> int:
        """Class, distillation and register tokens before the patches."""
        return self.config.num_prefix_tokens

    @property
    def feature_info(self) -> List[Dict[str, Any]]:
        """timm's list: for every block its module name, channels and stride (the patch size in pixels)."""
        stride = self.config.pixel_patch_size[0]
        return [{"module": f"blocks.{i}", "num_chs": self.config.width, "reduction": stride}
                for i in range(len(self.blocks))]

    @property
    def pretrained_cfg(self) -> Dict[str, Any]:
        """timm's description of the weights: architecture, classes and the preprocessing they came with
        (``model.meta``; a freshly built model gets the default, marked ``default_preprocessing=True``)."""
        return {"architecture": self.config.name, "num_classes": self.config.num_classes,
                "label_names": self.meta.labels, "source": self.meta.source,
                **timm_data_config(self.config, self.meta.preprocessing)}

    default_cfg = pretrained_cfg  # timm's older name

    def get_classifier(self) -> nn.Module:
        """The classifier head (``nn.Identity`` when the model has none)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        """A new zero-initialised head (the paper's fine-tuning head) for ``num_classes`` classes (0: none, the
        model then returns its pooled features); the old class names no longer apply and are dropped.
        ``global_pool`` (timm's argument) may name the pooling the model already has."""
        if num_classes < 0:
            raise InputError(f"num_classes must be 0 or more, got {num_classes}")
        if global_pool is not None and TIMM_POOL.get(global_pool, global_pool) != self.config.pool:
            raise ConfigError(f"reset_classifier(global_pool={global_pool!r}): this model pools by "
                              f"{self.config.pool!r}; build it with that pooling instead")
        cfg = self.config = self.config.replace(num_classes=num_classes)
        ref = next(self.parameters())

        def zero_head(n_in: int) -> nn.Module:
            if not num_classes:
                return nn.Identity()
            lin = nn.Linear(n_in, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
            return lin
        self.head = zero_head(cfg.representation_size or cfg.width)
        if self.head_dist is not None or (cfg.distill_token and cfg.distill_head):
            self.head_dist = zero_head(cfg.width) if num_classes else None
        self.meta.labels = None
        return self

    def prune_intermediate_layers(self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last one ``indices`` needs (timm's call: a backbone for a dense task),
        and with ``prune_norm`` the final norm, with ``prune_head`` the pooled norm and the classifier; the
        config follows (depth, final_norm, num_classes). Returns the kept indices."""
        idx = resolve_indices(indices, len(self.blocks))
        keep = max(idx) + 1
        self.blocks = self.blocks[:keep]
        changes: Dict[str, Any] = {"depth": keep}
        if self.pos_embed is not None and self.config.posemb_where == "every_layer":
            self.pos_embed = nn.Parameter(self.pos_embed[:keep])
        if self.rel_pos is not None and len(self.rel_pos) > keep:
            self.rel_pos = self.rel_pos[:keep]
        if prune_norm and self.config.final_norm == "tokens":
            self.norm, changes["final_norm"] = nn.Identity(), "none"
        if prune_head and self.fc_norm is not None:
            self.fc_norm, changes["final_norm"] = None, "none"
        self.config = self.config.replace(**changes)
        if prune_head:
            self.reset_classifier(0)
        self.set_kernel_plan(self.kernel_plan.replace(head_tokens=self.config.head_tokens))
        return idx

    def forward_intermediates(self, x: torch.Tensor, indices: Union[None, int, Sequence[int]] = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False, output_dict: bool = False,
                              *, return_attention: bool = False) -> Any:
        """timm's call: ``(final tokens normed, [patch-token maps of the chosen blocks])``, the maps [B, D, rows,
        cols] ("NCHW") or [B, N, D] ("NLC"), each paired with its prefix tokens as ``(map, prefix)`` with
        ``return_prefix_tokens``; the list alone with ``intermediates_only``; timm's dict with ``output_dict``.
        ``indices``: None for every block, an int n for the last n, or a list (negative ones count from the
        end); ``norm``: the final norm on each; ``stop_early``: no block after the last chosen one.

        ``output_fmt="dict"``: vitkit's dict (big_vision's style) with ``indices``, ``intermediates`` (every
        token after each chosen block), ``grid``, ``features`` (None when ``stop_early`` stopped before the
        last block) and, with ``return_attention``, the blocks' attention maps [B, heads, T, T]."""
        check_output_fmt(output_fmt)
        if return_attention and output_fmt != "dict":
            raise InputError("return_attention=True returns the maps in vitkit's dict: pass output_fmt='dict'")
        idx = resolve_indices(indices, len(self.blocks))
        tokens, grid = self.embed(x)
        last = max(idx) if stop_early or intermediates_only else None
        tokens, saved, maps = self._run_blocks(tokens, grid, idx, return_attention, last)
        inter = [self.norm(saved[i]) if norm else saved[i] for i in idx]
        if output_fmt == "dict":
            out = {"indices": idx, "intermediates": inter, "grid": grid,
                   "features": None if last is not None and last < len(self.blocks) - 1 else self.norm(tokens)}
            if return_attention:
                out["attention"] = [maps[i] for i in idx]
            return out
        p = self.config.num_prefix_tokens
        layout = timm_layout(inter, grid, p, output_fmt, return_prefix_tokens and not output_dict)
        if output_dict:
            out = {"image_intermediates": layout}
            if return_prefix_tokens and p:
                out["image_intermediates_prefix"] = [t[:, :p] for t in inter]
            if not intermediates_only:
                out["image_features"] = self.norm(tokens)
            return out
        return layout if intermediates_only else (self.norm(tokens), layout)

    def forward_feature_maps(self, x: torch.Tensor, indices: Union[int, Sequence[int]] = 4,
                             scales: Optional[Sequence[float]] = None, norm: bool = False) -> List[torch.Tensor]:
        """Feature maps for dense tasks (timm's ``features_only``): the patch tokens of the chosen blocks
        (default: the last 4) as maps [B, D, rows, cols], all at the patch stride. ``scales`` makes them a
        pyramid, one scale per map (e.g. ``(4, 2, 1, 0.5)``: strides P/4 ... 2P, as ViTDet's simple feature
        pyramid but without parameters): up by bilinear interpolation, down by average pooling."""
        maps = self.forward_intermediates(x, indices, norm=norm, output_fmt="NCHW", intermediates_only=True)
        return maps if scales is None else feature_pyramid(maps, scales)


TIMM_POOL = {"token": "token", "avg": "gap", "map": "map"}  # timm's global_pool names -> vitkit's pool
