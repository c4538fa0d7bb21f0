"""Model configuration: one frozen dataclass drives every ViT variant.

Variants are data (Table 1 of the paper plus the Ti/S sizes used by later
work); a name such as ``B/16``, ``vit_base_patch16_224`` or ``vit-b16`` is
parsed into a :class:`ViTConfig`.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .errors import ConfigError

POSEMB_KINDS = ("none", "learn", "learn2d", "relative", "sincos2d")
POSEMB_WHERE = ("input", "every_layer", "every_layer_shared")
POOL_KINDS = ("token", "gap", "map")  # map: attention pooling by a learned query (SigLIP's MAP head)
ATTENTION_KINDS = ("global", "axial")  # axial: row attention + MLP, then column attention + MLP (App. D.6)
GELU_KINDS = ("exact", "tanh", "quick")  # quick: x * sigmoid(1.702 x), OpenAI CLIP's QuickGELU
FINAL_NORMS = ("tokens", "pooled", "none")  # LN on every token before pooling (Eq. 4) | after pooling | none
RESIZE_METHODS = ("bilinear", "bicubic")  # bilinear = authors' aligned-corners resize
BACKBONES = ("resnet",)  # hybrid front-ends (Section 3.1); None = patches of the raw image
STD_CONV_STYLES = ("std", "var")  # (w-mean)/(std+eps): authors' Flax; (w-mean)/sqrt(var+eps): timm

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
    drop_path: float = 0.0  # stochastic depth, rate grows linearly to this value over depth
    patch_drop: float = 0.0  # training only: drop this fraction of patch tokens per image (PatchDropout)
    ln_eps: float = 1e-6
    gelu: str = "exact"  # exact (erf, PyTorch libraries) | tanh (Flax's nn.gelu default)
    posemb_resize: str = "bilinear"  # bilinear (aligned corners, authors) | bicubic (timm)
    posemb_antialias: bool = False  # antialias when a table shrinks (bicubic; timm's resample does, HF's does not)
    dynamic_img_size: bool = False  # accept other input sizes, resizing position embeddings on the fly
    dynamic_img_pad: bool = False  # pad inputs on the right/bottom up to a multiple of the patch size
    # Hybrid (Section 3.1): patches (usually 1x1) of a BiT ResNet feature map instead of the image.
    backbone: Optional[str] = None  # None (pure ViT) | "resnet"
    backbone_layers: Tuple[int, ...] = (3, 4, 9)  # bottleneck units per stage; () = root only
    backbone_width: int = 64  # root channels (64 x BiT width factor); stage i has width * 2**i
    std_conv_eps: float = 1e-5  # weight standardisation eps: 1e-5 authors (style std), 1e-8 timm (var)
    std_conv_style: str = "std"  # std: (w-mean)/(std+eps) authors' Flax | var: (w-mean)/sqrt(var+eps) timm
    gn_eps: float = 1e-6  # GroupNorm eps: 1e-6 authors' Flax, 1e-5 timm
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
        for key, allowed in (("posemb", POSEMB_KINDS), ("posemb_where", POSEMB_WHERE),
                             ("pool", POOL_KINDS), ("attention", ATTENTION_KINDS), ("gelu", GELU_KINDS), ("posemb_resize", RESIZE_METHODS),
                             ("final_norm", FINAL_NORMS),
                             ("backbone", (None,) + BACKBONES), ("std_conv_style", STD_CONV_STYLES)):
            value = getattr(self, key)
            if value not in allowed:
                allowed = tuple(a for a in allowed if a is not None)
                hint = difflib.get_close_matches(str(value), allowed, n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else ""
                raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}{extra}")
        for key in ("in_chans", "width", "depth", "num_heads", "mlp_dim"):
            if int(getattr(self, key)) <= 0 and not (key == "depth" and self.depth == 0 and self.backbone):
                raise ConfigError(f"{key} must be a positive integer, got {getattr(self, key)!r}"
                                  + (" (depth=0 is only for a backbone: the ResNet classifier)" if key == "depth" else ""))
        if self.depth == 0 and (self.posemb != "none" or self.pool != "gap" or self.class_token):
            raise ConfigError("depth=0 (a BiT ResNet classifier: backbone, projection, LayerNorm, average pooling, head) "
                              "has no Transformer: set posemb='none', pool='gap', class_token=False")
        if self.num_classes < 0:
            raise ConfigError(f"num_classes must be >= 0 (0 = no head), got {self.num_classes}")
        if self.width % self.num_heads:
            raise ConfigError(
                f"width {self.width} is not divisible by num_heads {self.num_heads}: "
                f"choose a head count that divides the width (e.g. {self.width // 64 or 1} heads of 64)")
        if self.posemb == "sincos2d" and self.width % 4:
            raise ConfigError(f"sincos2d position embeddings need a width divisible by 4, got {self.width}")
        if self.posemb == "learn2d" and self.width % 2:
            raise ConfigError(f"learn2d position embeddings need an even width, got {self.width}")
        if self.pool == "token" and not self.class_token:
            raise ConfigError("pool='token' reads out the class token: set class_token=True or pool='gap'")
        if self.distill_token:
            problems = [what for what, bad in (
                ("a class token read-out (class_token=True, pool='token')",
                 not self.class_token or self.pool != "token"),
                ("no pre-logits layer (representation_size=None)", self.representation_size is not None),
                ("no relative position bias (posemb other than 'relative')", self.posemb == "relative")) if bad]
            if problems:
                raise ConfigError("distill_token=True (DeiT's distillation token) needs " + "; ".join(problems))
        elif not self.distill_head:
            raise ConfigError("distill_head=False only applies to a model with distill_token=True")
        if self.reg_tokens < 0:
            raise ConfigError(f"reg_tokens must be 0 or more, got {self.reg_tokens}")
        if self.reg_tokens and (self.distill_token or self.posemb == "relative" or self.posemb_where != "input"):
            raise ConfigError("register tokens (reg_tokens) need no distillation token, and position embeddings "
                              "added once at the input (posemb none/learn/learn2d/sincos2d, posemb_where='input')")
        if self.layer_scale is not None and not float(self.layer_scale) > 0:
            raise ConfigError(f"layer_scale is the initial scale of each residual branch: a positive number, or "
                              f"None for no layer scale; got {self.layer_scale!r}")
        if self.pool == "map" and (self.distill_token or self.representation_size is not None):
            raise ConfigError("pool='map' (attention pooling) takes no distillation token and no pre-logits layer "
                              "(representation_size=None)")
        for key in ("dropout", "attn_dropout", "drop_path", "patch_drop"):
            if not 0.0 <= float(getattr(self, key)) < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {getattr(self, key)!r}")
        if self.patch_drop and (self.posemb == "relative" or self.posemb_where != "input"):
            raise ConfigError(
                "patch_drop needs position embeddings added once at the input (posemb none/learn/learn2d/"
                f"sincos2d, posemb_where='input'), got posemb={self.posemb!r}, posemb_where={self.posemb_where!r}")
        if self.attention == "axial" and (self.num_prefix_tokens or self.posemb == "relative" or self.patch_drop
                                          or self.dynamic_img_pad):
            raise ConfigError("attention='axial' attends along the rows and columns of the patch grid: it needs "
                              "no class or distillation token (pool='gap', class_token=False), no relative "
                              "position bias, no patch dropout and no dynamic_img_pad")
        if self.ln_eps <= 0:
            raise ConfigError(f"ln_eps must be positive, got {self.ln_eps}")
        for key in ("std_conv_eps", "gn_eps"):
            if not float(getattr(self, key)) > 0:
                raise ConfigError(f"{key} must be positive, got {getattr(self, key)!r}")
        if self.backbone_width <= 0 or self.backbone_width % 32:
            raise ConfigError(f"backbone_width must be a positive multiple of 32 (GroupNorm has 32 groups), "
                              f"got {self.backbone_width}")
        if not self.dynamic_img_pad:
            (h, w), (ph, pw) = self.feature_size(self.img_size), self.patch_size
            if h % ph or w % pw:
                what = "image" if self.backbone is None else f"backbone feature map (stride {self.feature_stride})"
                raise ConfigError(
                    f"{what} {h}x{w} is not divisible by patch {ph}x{pw}: choose an image size that is a "
                    f"multiple of the patch size or pass dynamic_img_pad=True")

    # --- derived quantities -------------------------------------------------
    @property
    def feature_stride(self) -> int:
        """Downsampling before patching: 1 for a pure ViT, the ResNet's total stride for a hybrid."""
        if self.backbone is None:
            return 1
        return 4 * 2 ** max(len(self.backbone_layers) - 1, 0)

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

    # --- (de)serialisation ----------------------------------------------------
    def replace(self, **overrides: Any) -> "ViTConfig":
        """A copy with ``overrides`` (config fields, checked for type) set."""
        checked = check_fields(overrides)
        return dataclasses.replace(self, **{k: checked[k] if v is None else v for k, v in overrides.items()})

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


# --- typed fields: the type of every config and recipe key comes from its dataclass annotation -----------
@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> Dict[str, Any]:
    """The resolved type annotation of each field of the dataclass ``cls``."""
    return typing.get_type_hints(cls)


class _Mismatch(Exception):
    pass


def coerce_field(cls: type, name: str, value: Any, key: Optional[str] = None, *, scalar_pairs: bool = False) -> Any:
    """``value`` checked against the annotation of field ``name`` of the dataclass ``cls`` and returned in
    that type (an int where a float is expected becomes a float, a list where a tuple is expected a
    tuple). A mismatch raises ConfigError naming the key, the value and the expected type."""
    tp = field_types(cls)[name]
    try:
        return _coerce(value, tp, scalar_pairs)
    except _Mismatch:
        raise ConfigError(f"got {value!r}, expected {describe_type(tp, scalar_pairs)}", key=key or name,
                          hint=f"e.g. {key or name}={_example(tp)}") from None


def _coerce(value: Any, tp: Any, scalar_pairs: bool = False) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return _coerce(value, a, scalar_pairs)
                except _Mismatch:
                    pass
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        raise _Mismatch
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        if value is None:  # a field that is always a string: `--set augment.crop=none` means the word
            return "none"
        if isinstance(value, numbers.Real) and not isinstance(value, bool):  # --set data.dataset=123
            return str(value)
        raise _Mismatch
    if origin in (tuple, list):
        if scalar_pairs and not isinstance(value, (list, tuple)) and args and args[-1] is not Ellipsis:
            item = _coerce(value, args[0])
            return tuple(item for _ in args)
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_coerce(v, a) for v, a in zip(value, args))
        items = [_coerce(v, args[0]) for v in value] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    return value  # an annotation we do not check


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def describe_type(tp: Any, scalar_pairs: bool = False) -> str:
    """An annotation in words: 'an integer', 'a number or null', 'a list of 2 numbers' ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        parts = [describe_type(a, scalar_pairs) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin in (tuple, list):
        if not args:
            return "a list"
        if origin is tuple and args[-1] is not Ellipsis:
            plural = describe_type(args[0]).split(" ", 1)[-1] + "s"
            text = f"a list of {len(args)} {plural}"
            return f"{describe_type(args[0])} or {text}" if scalar_pairs else text
        return f"a list of {describe_type(args[0]).split(' ', 1)[-1]}s"
    if origin is dict or tp is dict:
        return "a mapping"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _example(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return _example(next(a for a in args if a is not type(None)))
    if origin in (tuple, list):
        n = len(args) if origin is tuple and args and args[-1] is not Ellipsis else 2
        return "[" + ",".join([_example(args[0]) if args else "1"] * n) + "]"
    return {bool: "true", int: "8", float: "0.5", str: "NAME"}.get(tp, "...")


# --- names ------------------------------------------------------------------
_REGISTRY: Dict[str, Dict[str, Any]] = {}


def register_model(name: str, **config: Any) -> None:
    """Register a named configuration (e.g. a small model for 28 px images)."""
    check_fields(config)
    _REGISTRY[name] = dict(config)


def list_models(pattern: Optional[str] = None) -> list:
    """Canonical names: the paper's models, the hybrids, the descendants (DeiT III, DINOv2, CLIP and SigLIP
    towers: :mod:`vitkit.families`), then registered ones; ``pattern`` keeps those
    matching a shell-style wildcard, case-insensitive (``"B/*"``, ``"*16"``, ``"R50*"``)."""
    from .families import FAMILIES
    names = list(PAPER_MODELS) + list(HYBRID_MODELS) + list(FAMILIES) + sorted(_REGISTRY)
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
    if name in _REGISTRY:
        return dict(_REGISTRY[name], name=name)
    from .families import family_fields
    family = family_fields(name)
    if family:
        return dict(family[1], name=family[0])
    s = name.strip().lower()
    s = re.sub(r"^(google|facebook)/", "", s)
    deit = re.match(r"^deit[-_/ .]+(.+)$", s)
    if deit:  # DeiT's models are the ViT sizes; the distilled ones add the distillation token
        rest = re.sub(r"(^|[-_/ .])distilled(?=$|[-_/ .])", r"\1", deit.group(1))
        fields = parse_model_name("vit_" + rest)
        distilled = rest != deit.group(1)
        fields["name"] = "DeiT-" + fields["name"] + (" distilled" if distilled else "")
        if distilled:
            fields["distill_token"] = True
        return fields
    hybrid = _HYBRID_RE.match(s) or _TIMM_HYBRID_RE.match(s)
    if hybrid:
        return _parse_hybrid(name, hybrid)
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


def config_from_name(name: str, **overrides: Any) -> ViTConfig:
    fields = parse_model_name(name)
    checked = check_fields(overrides)
    fields.update({k: checked[k] if v is None else v for k, v in overrides.items()})  # None: "none" for names
    return ViTConfig(**fields)
