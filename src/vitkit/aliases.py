"""timm's ``create_model`` keyword arguments as vitkit's config fields.

``vitkit.create_model("vit_small_patch16_224", drop_path_rate=0.1, global_pool="avg")`` builds the model
``timm.create_model`` builds with the same arguments: each timm argument is translated here into the
:class:`~vitkit.config.ViTConfig` fields that mean the same, once, before the config is built. An argument
with no vitkit counterpart at a value that would change the model is refused with the fix, never dropped.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from .errors import ConfigError
from .models.intermediates import TIMM_POOL

# timm argument -> vitkit field, where the value carries over unchanged
RENAMED = {"drop_path_rate": "drop_path", "attn_drop_rate": "attn_dropout", "patch_drop_rate": "patch_drop",
           "drop_rate": "head_dropout", "init_values": "layer_scale", "embed_dim": "width", "pre_norm": "norm_pre"}
TIMM_ARGS = tuple(RENAMED) + ("global_pool", "fc_norm", "no_embed_class", "mlp_ratio", "pos_drop_rate",
                              "proj_drop_rate")


def from_timm(kwargs: Mapping[str, Any], width: Optional[int] = None) -> Dict[str, Any]:
    """``kwargs`` with timm's arguments (:data:`TIMM_ARGS`) replaced by vitkit's config fields; vitkit's own
    fields pass through. ``width``: the model's width where ``kwargs`` do not set it (for ``mlp_ratio``).
    ConfigError when an argument has no vitkit equivalent at its value, or when a timm argument and the
    vitkit field it sets are both given with different values."""
    out = {k: v for k, v in kwargs.items() if k not in TIMM_ARGS}
    fields: Dict[str, Any] = {}
    for timm_name, field in RENAMED.items():
        if timm_name in kwargs:
            fields[field] = kwargs[timm_name]
    if "init_values" in kwargs and not kwargs["init_values"]:  # timm: 0 or None is no LayerScale
        fields["layer_scale"] = None
    drops = {k: float(kwargs[k]) for k in ("pos_drop_rate", "proj_drop_rate") if k in kwargs}
    rates = set(drops.values())
    if len(rates) > 1 or (len(drops) == 1 and rates != {0.0}):  # timm's default for the other one is 0
        raise ConfigError(f"{', '.join(f'{k}={v}' for k, v in drops.items())}: vitkit's dropout is one rate after "
                          f"the position embedding and every dense layer; give pos_drop_rate and proj_drop_rate "
                          f"the same value (or pass dropout=)")
    if rates:
        fields["dropout"] = rates.pop()
    if "global_pool" in kwargs:
        fields.update(_pool(kwargs["global_pool"], kwargs.get("fc_norm")))
    if kwargs.get("fc_norm") is not None:
        fields["final_norm"] = "pooled" if kwargs["fc_norm"] else "tokens"
    if kwargs.get("no_embed_class") is not None:
        fields["posemb_class_slot"] = not kwargs["no_embed_class"]
    if kwargs.get("mlp_ratio") is not None:
        width = fields.get("width", out.get("width", width))
        if width is None:
            raise ConfigError("mlp_ratio needs the width beside it (embed_dim= or width=): vitkit sets the MLP size "
                              "as mlp_dim=")
        fields["mlp_dim"] = int(width * float(kwargs["mlp_ratio"]))
    for field, value in fields.items():
        if field in out and out[field] != value:
            raise ConfigError(f"{field}={out[field]!r} and timm's argument for it ({value!r}) disagree: pass one")
        out[field] = value
    return out


def _pool(global_pool: Any, fc_norm: Any) -> Dict[str, Any]:
    if global_pool == "":
        raise ConfigError("global_pool='' (timm: no pooling, forward returns every token) has no vitkit "
                          "equivalent: call model.forward_features(x) for the tokens [B, tokens, width]")
    if global_pool not in TIMM_POOL:
        raise ConfigError(f"global_pool={global_pool!r}: vitkit pools with {', '.join(map(repr, TIMM_POOL))} "
                          f"(timm's names; vitkit's pool= 'token', 'gap', 'map')")
    fields: Dict[str, Any] = {"pool": TIMM_POOL[global_pool]}
    if global_pool == "avg" and fc_norm is None:  # timm: fc_norm defaults to on for average pooling
        fields["final_norm"] = "pooled"
    return fields


__all__ = ["RENAMED", "TIMM_ARGS", "from_timm"]
