"""Model configuration: one frozen dataclass drives every ViT variant.

Variants are data (Table 1 of the paper plus the Ti/S sizes used by later
work, :mod:`vitkit.variants`); a name such as ``B/16``, ``vit_base_patch16_224``
or ``vit-b16`` is parsed into a :class:`ViTConfig` by :func:`config_from_name`.
Each field's type is checked by :mod:`vitkit.fields`.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .errors import ConfigError, InputError
from .fields import coerce_field, describe_type, field_types
from .variants import (
    HYBRID_MODELS,
    PAPER_MODELS,
    REGISTERED,
    RESNET_DEPTHS,
    SIZE_ALIASES,
    SIZES,
    list_models,
    parse_model_name,
)

__all__ = ["ATTENTION_KINDS", "BACKBONES", "BACKBONE_STEMS", "BACKBONE_UNITS", "FINAL_NORMS", "GELU_KINDS",
           "HYBRID_MODELS", "PAPER_MODELS", "POOL_KINDS",
           "POSEMB_KINDS", "POSEMB_WHERE", "RESIZE_METHODS", "RESNET_DEPTHS", "SIZES", "SIZE_ALIASES",
           "STD_CONV_STYLES", "ConfigError", "ViTConfig", "check_fields", "coerce_field", "config_from_name",
           "describe_type", "field_types", "grid_for", "list_models", "parse_model_name", "register_model",
           "trunk_stride"]

POSEMB_KINDS = ("none", "learn", "learn2d", "relative", "sincos2d")
POSEMB_WHERE = ("input", "every_layer", "every_layer_shared")
POOL_KINDS = ("token", "gap", "map")  # map: attention pooling by a learned query (SigLIP's MAP head)
ATTENTION_KINDS = ("global", "axial")  # axial: row attention + MLP, then column attention + MLP (App. D.6)
GELU_KINDS = ("exact", "tanh", "quick")  # quick: x * sigmoid(1.702 x), OpenAI CLIP's QuickGELU
FINAL_NORMS = ("tokens", "pooled", "none")  # LN on every token before pooling (Eq. 4) | after pooling | none
RESIZE_METHODS = ("bilinear", "bicubic")  # bilinear = authors' aligned-corners resize
BACKBONES = ("resnet",)  # hybrid front-ends (Section 3.1); None = patches of the raw image
STD_CONV_STYLES = ("std", "var")  # (w-mean)/(std+eps): authors' Flax; (w-mean)/sqrt(var+eps): timm
# the backbone's root -> its stride: BiT's 7x7/2 conv + 3x3/2 max-pool | one 3x3/1 conv, no pool (small images)
BACKBONE_STEMS = {"bit": 4, "3x3": 1}
# the backbone's unit -> its channel expansion: BiT / R50 bottleneck (1x1 -> 3x3 -> 1x1) | ResNet-18/34 (3x3 -> 3x3)
BACKBONE_UNITS = {"bottleneck": 4, "basic": 1}


def trunk_stride(stem: str, n_stages: int) -> int:
    """Total downsampling of a ResNet trunk: its root's, then 2 per stage after the first."""
    return BACKBONE_STEMS[stem] * 2 ** max(n_stages - 1, 0)


def _pair(v: Any, what: str) -> Tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    try:
        a, b = (int(x) for x in v)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be an int or a pair of ints, got {v!r}") from None
    if a <= 0 or b <= 0 or (a, b) != tuple(v):
        raise ConfigError(f"{what} must be positive integers, got {v!r}")
    return a, b


@dataclass(frozen=True)
class ViTConfig:
    """Everything that defines a Vision Transformer (Eq. 1-4 and Appendix D options)."""

    img_size: Tuple[int, int] = (224, 224)  # (height, width); an int means square
    patch_size: Tuple[int, int] = (16, 16)
    in_chans: int = 3
    num_classes: int = 1000  # 0: no head, forward() returns the pooled features
    width: int = 768  # D, the hidden size
    depth: int = 12  # L, the number of encoder blocks; 0 with a backbone: a BiT ResNet classifier (Figs 3-4 baseline)
    num_heads: int = 12
    mlp_dim: int = 3072
    class_token: bool = True
    # DeiT's distillation token (Touvron et al. 2021): a second learned token after the class token, read
    # out by its own head (head_dist); trained on a teacher's labels, averaged with the class head at test
    distill_token: bool = False
    # False: the distillation token stays in the sequence but only the class token is read out (one head;
    # Hugging Face's DeiTForImageClassification / DeiTModel)
    distill_head: bool = True
    # register tokens (Darcet et al. 2024, DINOv2 with registers): learned tokens after the class (and
    # distillation) token, without position embeddings, dropped before pooling
    reg_tokens: int = 0
    # "token": read out token 0 (Eq. 4); "gap": mean of patch tokens (App. D.3); "map": multihead attention
    # pooling of the patch tokens by one learned query, then LN + MLP on a residual (SigLIP; no class token)
    pool: str = "token"
    # "global": every block attends over all tokens; "axial" (Axial-ViT, App. D.6): every block is a pre-norm
    # block over each row of the patch grid followed by one over each column (twice the block parameters)
    attention: str = "global"
    posemb: str = "learn"  # none | learn (1D) | learn2d | relative | sincos2d (App. D.4)
    posemb_where: str = "input"  # input | every_layer | every_layer_shared (Table 8)
    # the learned table has slots for the class (and distillation) token; False: those tokens get no
    # position and the table covers the patches only (timm's no_embed_class: DeiT III, DINOv2 with registers)
    posemb_class_slot: bool = True
    representation_size: Optional[int] = None  # pre-logits layer (tanh) of the pre-training head
    qkv_bias: bool = True
    patch_bias: bool = True  # bias of the patch projection E (OpenAI CLIP has none)
    # LayerScale (Touvron et al. 2021, DeiT III, DINOv2): a learned per-channel scale on each residual branch,
    # initialised to this value; None: no scale (the paper's block)
    layer_scale: Optional[float] = None
    norm_pre: bool = False  # a LayerNorm on the embedded tokens before the first block (CLIP's ln_pre)
    # the final LayerNorm: "tokens" on every token before pooling (Eq. 4), "pooled" after pooling (timm's
    # fc_norm; Hugging Face's CLIP: its last hidden state is not normalised), "none"
    final_norm: str = "tokens"
    dropout: float = 0.0  # after position embedding and after every dense layer but qkv
    attn_dropout: float = 0.0
    head_dropout: float = 0.0  # on the pooled features before the classifier head (timm's drop_rate)
    drop_path: float = 0.0  # stochastic depth, rate grows linearly to this value over depth
    patch_drop: float = 0.0  # training only: drop this fraction of patch tokens per image (PatchDropout)
    ln_eps: float = 1e-6
    gelu: str = "exact"  # exact (erf, PyTorch libraries) | tanh (Flax's nn.gelu default)
    posemb_resize: str = "bilinear"  # bilinear (aligned corners, authors) | bicubic (timm)
    posemb_antialias: bool = False  # antialias when a table shrinks (bicubic; timm's resample does, HF's does not)
    dynamic_img_size: bool = False  # accept other input sizes, resizing position embeddings on the fly
    dynamic_img_pad: bool = False  # pad inputs on the right/bottom up to a multiple of the patch size
    # an image size that is not a multiple of the patch: the pixels past the last whole patch are not read, as a
    # stride-P convolution without padding (timm, Hugging Face: SigLIP so400m at 384 px with 14 px patches)
    crop_remainder: bool = False
    # Hybrid (Section 3.1): patches (usually 1x1) of a BiT ResNet feature map instead of the image.
    backbone: Optional[str] = None  # None (pure ViT) | "resnet"
    backbone_layers: Tuple[int, ...] = (3, 4, 9)  # bottleneck units per stage; () = root only
    backbone_width: int = 64  # root channels (64 x BiT width factor); stage i has width * 2**i
    # the root: "bit" (7x7/2 conv + max-pool, stride 4) | "3x3" (3x3/1 conv, no pool: CIFAR-style, small images)
    backbone_stem: str = "bit"
    backbone_unit: str = "bottleneck"  # "bottleneck" (BiT, R50: 4x expansion) | "basic" (ResNet-18/34: 3x3 -> 3x3)
    std_conv_eps: float = 1e-5  # weight standardisation eps: 1e-5 authors (style std), 1e-8 timm (var)
    std_conv_style: str = "std"  # std: (w-mean)/(std+eps) authors' Flax | var: (w-mean)/sqrt(var+eps) timm
    gn_eps: float = 1e-6  # GroupNorm eps: 1e-6 authors' Flax, 1e-5 timm
    # the last block computes only the tokens the head reads (head_tokens): the same logits, ~7% fewer products
    # at B/16; False: every token (for hooks on the last block that need them all; forward_features always has)
    head_tokens_only: bool = True
    name: Optional[str] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("img_size", _pair(self.img_size, "img_size"))
        set_("patch_size", _pair(self.patch_size, "patch_size"))
        set_("backbone_layers", _layers(self.backbone_layers))
        if self.representation_size is not None:
            set_("representation_size", int(self.representation_size))
        if self.layer_scale is not None:
            set_("layer_scale", float(self.layer_scale))
        for check in (_check_choices, _check_sizes, _check_tokens, _check_rates, _check_backbone):
            check(self)


    # --- derived quantities -------------------------------------------------
    @property
    def feature_stride(self) -> int:
        """Downsampling before patching: 1 for a pure ViT, the ResNet's total stride for a hybrid."""
        if self.backbone is None:
            return 1
        return trunk_stride(self.backbone_stem, len(self.backbone_layers))

    def feature_size(self, img_size: Tuple[int, int]) -> Tuple[int, int]:
        """Size of the map that is cut into patches (SAME padding: ceil at every stride-2 step)."""
        s = self.feature_stride
        return -(-img_size[0] // s), -(-img_size[1] // s)

    @property
    def pixel_patch_size(self) -> Tuple[int, int]:
        """Pixels per token side: the patch size times the backbone stride ("/16" of R50+B/16)."""
        s = self.feature_stride
        return self.patch_size[0] * s, self.patch_size[1] * s

    @property
    def grid_size(self) -> Tuple[int, int]:
        """Patch grid (rows, columns) at the built image size."""
        return grid_for(self.feature_size(self.img_size), self.patch_size, pad=self.dynamic_img_pad)

    @property
    def num_patches(self) -> int:
        gh, gw = self.grid_size
        return gh * gw

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches in the sequence the blocks see: class, distillation, registers."""
        return int(self.class_token) + int(self.distill_token) + self.reg_tokens

    @property
    def head_tokens(self) -> Optional[int]:
        """How many leading tokens of the last block the head reads: 1 (token pooling: the class token), 2 (and
        a distillation token read out by its own head), None (every token: GAP, MAP, blocks that are not
        global attention, or ``head_tokens_only=False``). The model computes its last block for these tokens
        only (:meth:`vitkit.models.VisionTransformer.forward_outputs`)."""
        if self.attention != "global" or self.depth < 1 or not self.head_tokens_only:
            return None
        if self.distill_token and self.distill_head:
            return 2
        return 1 if self.pool == "token" else None

    @property
    def num_posemb_prefix(self) -> int:
        """Slots of the learned position table before the patches: the class and distillation tokens
        (registers have none)."""
        return (int(self.class_token) + int(self.distill_token)) if self.posemb_class_slot else 0

    @property
    def seq_len(self) -> int:
        """Tokens the blocks see."""
        return self.num_patches + self.num_prefix_tokens

    @property
    def posemb_len(self) -> int:
        """Slots of the learned 1D position table."""
        return self.num_patches + self.num_posemb_prefix

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def num_posemb_tables(self) -> int:
        """How many separate position-embedding tables the model learns."""
        return self.depth if self.posemb_where == "every_layer" else 1

    def check_images(self, shape: Tuple[int, ...]) -> None:
        """An InputError unless ``shape`` is that of a batch of images [B, C, H, W] this model takes."""
        if len(shape) != 4:
            raise InputError(
                f"expected a batch of images [batch, channels, height, width], got a {len(shape)}-D tensor of "
                f"shape {tuple(shape)}" + (": add a batch axis with x.unsqueeze(0)" if len(shape) == 3 else ""))
        if shape[1] != self.in_chans:
            raise InputError(
                f"the model takes {self.in_chans}-channel images, got {shape[1]} channels (shape "
                f"{tuple(shape)}): convert the images (e.g. grayscale to RGB with x.expand(-1, 3, -1, -1)) "
                f"or build the model with in_chans={shape[1]}")
        (h, w), (ph, pw) = shape[-2:], self.patch_size
        if (h % ph or w % pw) and not (self.dynamic_img_pad or self.crop_remainder):
            raise InputError(
                f"image {h}x{w} is not divisible by patch {ph}x{pw}: resize or crop it to a multiple of "
                f"{ph}x{pw}, or build the model with dynamic_img_pad=True (or crop_remainder=True)")
        if (h, w) != self.img_size and not self.dynamic_img_size:
            bh, bw = self.img_size
            raise InputError(
                f"the model was built for {bh}x{bw} images, got {h}x{w}: resize the input, call "
                f"model.set_img_size(({h}, {w})) to resize the position embeddings once, or build the model "
                f"with dynamic_img_size=True to resize them on the fly")

    # --- (de)serialisation ----------------------------------------------------
    def replace(self, **overrides: Any) -> "ViTConfig":
        """A copy with ``overrides`` (config fields, checked for type) set."""
        return dataclasses.replace(self, **_given(overrides))

    def to_dict(self) -> Dict[str, Any]:
        """The fields as plain JSON values (pairs as lists): what vitkit.json stores."""
        d = dataclasses.asdict(self)
        d["img_size"] = list(self.img_size)
        d["patch_size"] = list(self.patch_size)
        d["backbone_layers"] = list(self.backbone_layers)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ViTConfig":
        check_fields(d)
        return cls(**d)


def _layers(v: Any) -> Tuple[int, ...]:
    try:
        out = tuple(int(n) for n in v)
    except (TypeError, ValueError):
        raise ConfigError(f"backbone_layers must be a sequence of ints, got {v!r}") from None
    if any(n <= 0 for n in out) or out != tuple(v):
        raise ConfigError(f"backbone_layers must be positive integers (units per stage), got {v!r}")
    return out

# --- the checks of ViTConfig.__post_init__, in this order: each raises ConfigError naming the fix ----------
def _check_choices(c: ViTConfig) -> None:
    for key, allowed in (("posemb", POSEMB_KINDS), ("posemb_where", POSEMB_WHERE), ("pool", POOL_KINDS),
                         ("attention", ATTENTION_KINDS), ("gelu", GELU_KINDS), ("posemb_resize", RESIZE_METHODS),
                         ("final_norm", FINAL_NORMS), ("backbone", (None,) + BACKBONES),
                         ("std_conv_style", STD_CONV_STYLES), ("backbone_stem", tuple(BACKBONE_STEMS)),
                         ("backbone_unit", tuple(BACKBONE_UNITS))):
        value = getattr(c, key)
        if value not in allowed:
            allowed = tuple(a for a in allowed if a is not None)
            hint = difflib.get_close_matches(str(value), allowed, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}{extra}")


def _check_sizes(c: ViTConfig) -> None:
    for key in ("in_chans", "width", "depth", "num_heads", "mlp_dim"):
        if int(getattr(c, key)) <= 0 and not (key == "depth" and c.depth == 0 and c.backbone):
            raise ConfigError(f"{key} must be a positive integer, got {getattr(c, key)!r}"
                              + (" (depth=0 is only for a backbone: the ResNet classifier)" if key == "depth" else ""))
    if c.depth == 0 and (c.posemb != "none" or c.pool != "gap" or c.class_token):
        raise ConfigError("depth=0 (a ResNet classifier: backbone, projection, LayerNorm, average pooling, "
                          "head) has no Transformer: set posemb='none', pool='gap', class_token=False")
    if c.num_classes < 0:
        raise ConfigError(f"num_classes must be >= 0 (0 = no head), got {c.num_classes}")
    if c.width % c.num_heads:
        raise ConfigError(
            f"width {c.width} is not divisible by num_heads {c.num_heads}: "
            f"choose a head count that divides the width (e.g. {c.width // 64 or 1} heads of 64)")
    if c.posemb == "sincos2d" and c.width % 4:
        raise ConfigError(f"sincos2d position embeddings need a width divisible by 4, got {c.width}")
    if c.posemb == "learn2d" and c.width % 2:
        raise ConfigError(f"learn2d position embeddings need an even width, got {c.width}")


def _check_tokens(c: ViTConfig) -> None:
    if c.pool == "token" and not c.class_token:
        raise ConfigError("pool='token' reads out the class token: set class_token=True or pool='gap'")
    if c.distill_token:
        problems = [what for what, bad in (
            ("a class token read-out (class_token=True, pool='token')", not c.class_token or c.pool != "token"),
            ("no pre-logits layer (representation_size=None)", c.representation_size is not None),
            ("no relative position bias (posemb other than 'relative')", c.posemb == "relative")) if bad]
        if problems:
            raise ConfigError("distill_token=True (DeiT's distillation token) needs " + "; ".join(problems))
    elif not c.distill_head:
        raise ConfigError("distill_head=False only applies to a model with distill_token=True")
    if c.reg_tokens < 0:
        raise ConfigError(f"reg_tokens must be 0 or more, got {c.reg_tokens}")
    if c.reg_tokens and (c.distill_token or c.posemb == "relative" or c.posemb_where != "input"):
        raise ConfigError("register tokens (reg_tokens) need no distillation token, and position embeddings "
                          "added once at the input (posemb none/learn/learn2d/sincos2d, posemb_where='input')")
    if c.layer_scale is not None and not float(c.layer_scale) > 0:
        raise ConfigError(f"layer_scale is the initial scale of each residual branch: a positive number, or "
                          f"None for no layer scale; got {c.layer_scale!r}")
    if c.pool == "map" and (c.distill_token or c.representation_size is not None):
        raise ConfigError("pool='map' (attention pooling) takes no distillation token and no pre-logits layer "
                          "(representation_size=None)")


def _check_rates(c: ViTConfig) -> None:
    for key in ("dropout", "attn_dropout", "head_dropout", "drop_path", "patch_drop"):
        if not 0.0 <= float(getattr(c, key)) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {getattr(c, key)!r}")
    if c.patch_drop and (c.posemb == "relative" or c.posemb_where != "input"):
        raise ConfigError(
            "patch_drop needs position embeddings added once at the input (posemb none/learn/learn2d/"
            f"sincos2d, posemb_where='input'), got posemb={c.posemb!r}, posemb_where={c.posemb_where!r}")
    if c.attention == "axial" and (c.num_prefix_tokens or c.posemb == "relative" or c.patch_drop
                                   or c.dynamic_img_pad):
        raise ConfigError("attention='axial' attends along the rows and columns of the patch grid: it needs "
                          "no class or distillation token (pool='gap', class_token=False), no relative "
                          "position bias, no patch dropout and no dynamic_img_pad")
    if c.ln_eps <= 0:
        raise ConfigError(f"ln_eps must be positive, got {c.ln_eps}")
    for key in ("std_conv_eps", "gn_eps"):
        if not float(getattr(c, key)) > 0:
            raise ConfigError(f"{key} must be positive, got {getattr(c, key)!r}")


def _check_backbone(c: ViTConfig) -> None:
    if c.backbone_width <= 0 or c.backbone_width % 32:
        raise ConfigError(f"backbone_width must be a positive multiple of 32 (GroupNorm has 32 groups), "
                          f"got {c.backbone_width}")
    if c.crop_remainder and (c.backbone is not None or c.dynamic_img_pad):
        raise ConfigError("crop_remainder=True (pixels past the last whole patch not read) is for a plain ViT's "
                          "image patches: a hybrid or a model with dynamic_img_pad=True pads instead")
    if not (c.dynamic_img_pad or c.crop_remainder):
        (h, w), (ph, pw) = c.feature_size(c.img_size), c.patch_size
        if h % ph or w % pw:
            what = "image" if c.backbone is None else f"backbone feature map (stride {c.feature_stride})"
            raise ConfigError(
                f"{what} {h}x{w} is not divisible by patch {ph}x{pw}: choose an image size that is a "
                f"multiple of the patch size, or pass dynamic_img_pad=True (pad) or crop_remainder=True (the "
                f"pixels past the last whole patch are not read, as timm and Hugging Face do)")


def grid_for(img_size: Tuple[int, int], patch_size: Tuple[int, int], pad: bool = False) -> Tuple[int, int]:
    (h, w), (ph, pw) = img_size, patch_size
    if pad:
        return -(-h // ph), -(-w // pw)
    return h // ph, w // pw


def check_fields(d: Dict[str, Any], where: str = "") -> Dict[str, Any]:
    """Every key is a ViTConfig field and every value has the field's type (``where`` prefixes the key in
    messages, e.g. "model."). Returns the values in their fields' types."""
    names = [f.name for f in dataclasses.fields(ViTConfig)]
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if k not in names:
            hint = difflib.get_close_matches(k, names, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown config field {k!r}{extra} (fields: {', '.join(names)})")
        # img_size / patch_size: an int means a square
        out[k] = coerce_field(ViTConfig, k, v, where + k, scalar_pairs=k in ("img_size", "patch_size"))
    return out


def _given(overrides: Dict[str, Any]) -> Dict[str, Any]:
    """``overrides`` checked as config fields, with None standing for a field's "none" name (e.g. posemb)."""
    checked = check_fields(overrides)
    return {k: checked[k] if v is None else v for k, v in overrides.items()}


def register_model(name: str, **config: Any) -> None:
    """Register a named configuration (e.g. a small model for 28 px images)."""
    check_fields(config)
    REGISTERED[name] = dict(config)


def config_from_name(name: str, **overrides: Any) -> ViTConfig:
    fields = parse_model_name(name)
    fields.update(_given(overrides))
    return ViTConfig(**fields)


AUTO_FIELDS = ("num_classes", "in_chans")  # fields a model section may leave to the dataset ("auto")


def section_config(section: Dict[str, Any], num_classes: Optional[int] = None, in_chans: Optional[int] = None,
                   base: Optional[ViTConfig] = None) -> ViTConfig:
    """The ViTConfig of a model section (a recipe's ``model``: ``arch``, a model name, plus any config field):
    ``base`` (a checkpoint's config) or the ``arch`` name (neither: the defaults), with the section's fields
    on top. ``num_classes`` / ``in_chans`` that are "auto" (or absent) take the values given here (None: the
    name's or the base's). Resolved in one pass: the fields checked, then the name, then the config built."""
    fields = {k: v for k, v in section.items() if k != "arch"}
    for key, value in zip(AUTO_FIELDS, (num_classes, in_chans)):
        if fields.get(key, "auto") == "auto":
            if value is not None:
                fields[key] = value
            else:
                fields.pop(key, None)
    given = _given(fields)
    if base is not None:
        return dataclasses.replace(base, **given)
    arch = section.get("arch")
    start = parse_model_name(arch) if arch else {}
    start.update(given)
    return ViTConfig(**start)
