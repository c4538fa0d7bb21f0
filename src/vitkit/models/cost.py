"""Analytical cost model: parameters, tokens, multiply-adds and activation memory of a configuration.

Counts every matrix product, the attention ones (QK^T and AV) included;
elementwise work (LayerNorm, GELU, softmax) is left out, as usual. FLOPs are
2 x MACs. Cross-checked in the tests against the model's real parameters and
against torch's FlopCounterMode.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional, Sequence, Union

from ..config import ViTConfig, grid_for
from ..errors import InputError
from .resnet import resnet_cost


@dataclass(frozen=True)
class Cost:
    img_size: tuple
    grid: tuple
    tokens: int
    params: int
    macs: int  # multiply-adds per image, forward
    macs_breakdown: Dict[str, int]
    act_inference_bytes: int  # peak live activations per image, forward without autograd (fused attention)
    act_train_bytes: int  # activations stored for backward per image (fused attention)
    state_train_bytes: int  # weights + gradients + Adam moments, fp32

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def to_dict(self) -> dict:
        d = asdict(self)
        d["flops"] = self.flops
        return d


def param_count(cfg: ViTConfig) -> int:
    d, m, c, r = cfg.width, cfg.mlp_dim, cfg.num_classes, cfg.representation_size
    gh, gw = cfg.grid_size
    ph, pw = cfg.patch_size
    bias = d if cfg.patch_bias else 0
    n = cfg.in_chans * ph * pw * d + bias  # patch embedding (conv kernel + bias)
    if cfg.backbone:  # hybrid: the ResNet, then the projection of its feature-map patches
        rc = resnet_cost(cfg.in_chans, cfg.backbone_layers, cfg.backbone_width, cfg.img_size,
                         stem=cfg.backbone_stem, unit=cfg.backbone_unit)
        n = rc["params"] + rc["out_chans"] * ph * pw * d + bias
    n += d * cfg.num_prefix_tokens  # class (and distillation) token, register tokens
    if cfg.posemb == "learn":
        n += cfg.num_posemb_tables * cfg.posemb_len * d  # registers have no slot
    elif cfg.posemb == "learn2d":
        n += cfg.num_posemb_tables * (gh + gw) * (d // 2)
    elif cfg.posemb == "relative":
        tables = 1 if cfg.posemb_where == "every_layer_shared" else cfg.depth
        n += tables * cfg.num_heads * ((2 * gh - 1) * (2 * gw - 1) + (3 if cfg.class_token else 0))
    block = 4 * d  # two LayerNorms
    block += 3 * d * d + (3 * d if cfg.qkv_bias else 0) + d * d + d  # qkv + out projection
    block += d * m + m + m * d + d  # MLP
    if cfg.layer_scale is not None:
        block += 2 * d  # LayerScale on both residual branches
    per_layer = 2 if cfg.attention == "axial" else 1  # axial: a row block and a column block per layer
    n += cfg.depth * per_layer * block
    n += 2 * d * (int(cfg.final_norm != "none") + int(cfg.norm_pre))  # final LayerNorm, CLIP's ln_pre
    if cfg.pool == "map":  # query, q / kv / output projections, LayerNorm, MLP
        n += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (d * m + m + m * d + d)
    if r:
        n += d * r + r
    if c:
        n += (r or d) * c + c
        if cfg.distill_token and cfg.distill_head:  # DeiT's distillation head
            n += d * c + c
    return n


def cost(cfg: ViTConfig, img_size: Union[None, int, Sequence[int]] = None) -> Cost:
    """Cost of one image through ``cfg`` (optionally at another input size)."""
    if img_size is not None:
        size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    else:
        size = cfg.img_size
    fsize = cfg.feature_size(size)  # the image itself, or a hybrid's ResNet feature map
    gh, gw = grid_for(fsize, cfg.patch_size, pad=cfg.dynamic_img_pad)
    uneven = fsize[0] % cfg.patch_size[0] or fsize[1] % cfg.patch_size[1]
    if img_size is not None and not (cfg.dynamic_img_pad or cfg.crop_remainder) and uneven:
        raise InputError(f"image {size[0]}x{size[1]} is not divisible by patch {cfg.patch_size[0]}x{cfg.patch_size[1]}")
    rc = (resnet_cost(cfg.in_chans, cfg.backbone_layers, cfg.backbone_width, size, stem=cfg.backbone_stem,
                      unit=cfg.backbone_unit) if cfg.backbone else None)
    n = gh * gw
    t = n + cfg.num_prefix_tokens
    d, m, h, L = cfg.width, cfg.mlp_dim, cfg.num_heads, cfg.depth
    ph, pw = cfg.patch_size
    # tokens each query attends to: all t, or (axial) its row's gw then its column's gh, in two blocks
    axial = cfg.attention == "axial"
    span = gw + gh if axial else t
    dense = 2 if axial else 1  # the dense layers run once per (row or column) block
    br = {
        **({"backbone": rc["macs"]} if rc else {}),
        "patch_embed": n * (rc["out_chans"] if rc else cfg.in_chans) * ph * pw * d,
        "qkv": dense * L * t * d * 3 * d,
        "attn_scores": L * t * span * d,  # QK^T over all heads
        "attn_values": L * t * span * d,  # AV over all heads
        "attn_proj": dense * L * t * d * d,
        "mlp": dense * L * 2 * t * d * m,
        **({"attn_pool": 2 * d * d + n * 2 * d * d + 2 * n * d + 2 * d * m} if cfg.pool == "map" else {}),
        "head": ((d * cfg.representation_size) if cfg.representation_size else 0)
        + (cfg.representation_size or d) * cfg.num_classes * (2 if cfg.distill_token and cfg.distill_head else 1),
    }
    f32 = 4
    img = cfg.in_chans * size[0] * size[1]
    # forward without autograd: the residual stream plus the largest transient (attention or MLP)
    attn_live = t * d + 3 * t * d + 3 * t * d + t * d  # LN out, qkv, q/k/v views made contiguous, output
    mlp_live = t * d + 2 * t * m
    act_inf = f32 * (img + t * d + max(attn_live, mlp_live, rc["act_inference"] if rc else 0))
    # stored for backward per block: LN inputs/outputs, qkv, attention output, softmax statistics, MLP hidden
    per_block = dense * (8 * t * d + 2 * t * m + h * t)
    act_train = f32 * (img + 2 * t * d + L * per_block + (rc["act_train"] if rc else 0))
    params = param_count(cfg.replace(img_size=size, dynamic_img_pad=cfg.dynamic_img_pad))
    return Cost(img_size=tuple(size), grid=(gh, gw), tokens=t, params=params, macs=sum(br.values()),
                macs_breakdown=br, act_inference_bytes=act_inf, act_train_bytes=act_train,
                state_train_bytes=4 * f32 * params)


# the fields by which the descendants (DeiT III, DINOv2, CLIP, SigLIP) differ from the paper's ViT
VARIANT_FIELDS = ("reg_tokens", "layer_scale", "norm_pre", "final_norm", "pool", "class_token", "gelu", "ln_eps",
                  "patch_bias", "qkv_bias", "posemb_class_slot")


def variant_fields(cfg: ViTConfig) -> Dict[str, object]:
    """The fields of :data:`VARIANT_FIELDS` that ``cfg`` sets to other than the paper's values."""
    default = ViTConfig()
    return {k: getattr(cfg, k) for k in VARIANT_FIELDS if getattr(cfg, k) != getattr(default, k)}


def format_cost(name: str, c: Cost, batch: int = 1, cfg: Optional[ViTConfig] = None) -> str:
    mib = 1024 ** 2
    variant = variant_fields(cfg) if cfg is not None else {}
    return "\n".join([
        f"model            {name}",
        *([f"differs from ViT {', '.join(f'{k}={v}' for k, v in variant.items())}"] if variant else []),
        f"image size       {c.img_size[0]}x{c.img_size[1]}  (patch grid {c.grid[0]}x{c.grid[1]})",
        f"tokens           {c.tokens}",
        f"parameters       {c.params:,}",
        f"multiply-adds    {c.macs / 1e9:.2f} GMACs per image",
        f"FLOPs            {c.flops / 1e9:.2f} GFLOPs per image (2 x MACs)",
        "  of which        " + ", ".join(f"{k} {v / 1e9:.3f}G" for k, v in c.macs_breakdown.items()),
        f"activations      inference peak ~{batch * c.act_inference_bytes / mib:.1f} MiB, "
        f"training ~{batch * c.act_train_bytes / mib:.1f} MiB stored for backward (fp32, batch {batch})",
        f"training state   ~{c.state_train_bytes / mib:.1f} MiB (weights, gradients, Adam moments; fp32)",
    ])
