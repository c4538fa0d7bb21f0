"""Recipes: named, printable, overridable training configurations.

A recipe is a YAML (or JSON) file with the sections ``model``, ``data``, ``augment``, ``optim``,
``schedule``, ``train``, ``init`` (and ``mpp`` / ``distill`` for those objectives). ``base: NAME``
inherits another recipe and changes only what it lists. Built-in recipes live in ``vitkit/recipes/*.yaml``
(``paper-pretrain``, ``paper-finetune``, ``deit``, ``plain-baseline``, ``fmnist-*``). Overrides are dotted
keys (``optim.lr=3e-4``) or, when unambiguous, bare field names (``lr=3e-4``). The resolved recipe is saved
in every run folder.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml

from ..config import ViTConfig, check_fields, coerce_field, config_from_name
from ..data.augment import AugmentConfig
from ..errors import ConfigError, NotFoundError
from ..models.mpp import MPP_TARGETS
from ..utils import PathLike, atomic_path
from .loggers import LOGGERS

_RECIPE_PACKAGE = "vitkit.recipes"
DEFAULT_RECIPE = "fmnist-demo"  # what `vitkit train` and load_recipe() train without a recipe (make demo)


@dataclass
class DataConfig:
    # fashion-mnist | mnist | cifar10:DIR | cifar100:DIR | folder:DIR | shards:PATTERN | tensors:FILE
    dataset: Optional[str] = "fashion-mnist"
    root: Optional[str] = None  # folder for specs without a path (e.g. Fashion-MNIST elsewhere)
    train_split: str = "train"
    eval_split: Optional[str] = "test"  # the test split, read once at the end (null: none)
    # The validation split: a seeded, class-stratified hold-out of the training split on which the run
    # evaluates periodically and chooses the exported weights (the test split is read once, at the end).
    val_size: Optional[int] = None  # images held out (wins over val_fraction)
    val_fraction: float = 0.0  # or this share of the training split (0 and no val_size: no validation split)
    val_seed: int = 0  # the hold-out's seed (kept apart from train.seed, so every seed sees the same split)
    mean: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: List[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    load_size: Optional[int] = None  # file datasets: decode to this square (default img_size / 0.875)
    workers: int = 0  # decoding processes for file datasets (at most the usable cores)
    cache: bool = False  # decode a file dataset once into memory (small datasets)
    train_subset: Optional[int] = None  # train on a seeded, class-stratified subset of this many images
    eval_batch_size: int = 500


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | adam | sgd
    lr: float = 1e-3  # peak learning rate (after warm-up)
    batch_size: int = 256  # global batch (all processes, all accumulation steps)
    accum_steps: int = 1  # gradient accumulation: micro-batch = batch_size / (processes * accum_steps)
    betas: Tuple[float, float] = (0.9, 0.999)  # the paper's Adam betas
    eps: float = 1e-8
    weight_decay: float = 0.1
    momentum: float = 0.9  # sgd
    nesterov: bool = False
    clip_grad: Optional[float] = 1.0  # global-norm clipping (the paper clips at 1); null or 0: none
    implementation: str = "auto"  # auto (fused where torch has it, else foreach) | fused | foreach | loop
    # layer-wise lr decay (BEiT; the usual fine-tuning of DINOv2, CLIP, SigLIP, DeiT III): block i of L gets
    # lr * layer_decay ** (L - i), the embeddings lr * layer_decay ** (L + 1), the head and final norms lr;
    # None: one lr for all
    layer_decay: Optional[float] = None


@dataclass
class ScheduleConfig:
    epochs: Optional[float] = 10  # length in epochs, or
    steps: Optional[int] = None  # in optimiser steps (wins over epochs)
    warmup_steps: Optional[int] = None  # linear warm-up from 0, in steps, or
    warmup_epochs: float = 0.0
    decay: str = "cosine"  # cosine | linear | constant
    min_lr: float = 0.0  # the lr at the end of decay
    # A training-time budget in minutes (evaluations and checkpoints excluded): the schedule then advances
    # by whichever is further along, steps done / total steps or training time / budget, and the run ends
    # when either is used up - on a slower machine the same recipe compresses its decay instead of
    # running over. Time-driven, so a resumed run is not bit-identical to an uninterrupted one.
    minutes: Optional[float] = None
    # Patch-dropout schedule (model.patch_drop > 0): the rate stays at model.patch_drop until this fraction
    # of the run, then moves linearly to patch_drop_end at the end (e.g. 0 to finish on all patches).
    patch_drop_end: Optional[float] = None
    patch_drop_from: float = 0.0


@dataclass
class TrainConfig:
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast with a gradient scaler; CUDA only)
    compile: bool = False  # torch.compile the model
    ema: float = 0.0  # Polyak / EMA decay of the weights (the paper: 0.9999); 0 = off
    ema_warmup: bool = True  # decay min(ema, (1 + t) / (10 + t)) early on, so short runs benefit too
    eval_every: float = 1.0  # epochs between evaluations (0 = only at the end)
    ckpt_every: int = 500  # steps between checkpoints (0 = end of epochs and run only)
    log_every: int = 50  # steps between metric lines
    deterministic: bool = False  # torch deterministic algorithms (exact resume on GPU too); pins the backend
    # the kernels (vitkit.models.backend): e.g. "gemm=aten,attention=fused"; null = the one in force when the run
    # starts (--backend, $VITKIT_BACKEND, else auto). The run folder's recipe.yaml records the spec it ran with.
    backend: Optional[str] = None
    threads: Optional[int] = None  # torch intra-op threads on CPU
    distributed: str = "ddp"  # ddp | fsdp (used when launched with torchrun)
    grad_checkpointing: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    export: str = "auto"  # exported weights: auto (raw or EMA, the better on the validation split) | ema | raw
    predictions: int = 16  # test images shown in predictions.png
    # the metrics also to: tensorboard (RUN/tensorboard), csv (RUN/metrics.csv)
    log: List[str] = field(default_factory=list)


@dataclass
class InitConfig:
    checkpoint: Optional[str] = None  # fine-tune from these weights (any format vitkit loads)
    head: str = "auto"  # auto (zero-init new head when classes differ) | reset | keep
    num_heads: Optional[int] = None  # for weight files that do not record it


@dataclass
class MPPConfig:
    """Masked patch prediction (Section 4.6), used by ``vitkit pretrain-mpp`` (``vitkit.train.mpp``)."""

    target: str = "mean_color"  # mean_color (3-bit mean colour, 512 classes for RGB) | color4x4 | pixels (L2)
    bits: int = 3  # quantisation of the colour targets per channel
    ratio: float = 0.5  # share of patch embeddings corrupted (the paper: 50%)
    p_mask: float = 0.8  # of those: replaced by the learned [mask] embedding
    p_random: float = 0.1  # ... by another random patch's embedding (the rest kept as is)
    eval_images: int = 2000  # evaluation-split images for the held-out MPP loss (0: all)
    figure_images: int = 6  # held-out images shown in mpp.png


@dataclass
class DistillConfig:
    """Knowledge distillation from a teacher (DeiT), used when ``teacher`` is set (``vitkit.train.distill``):
    loss = (1 - alpha) * CE(student, labels) + alpha * teacher term."""

    teacher: Optional[str] = None  # the teacher's weights: any checkpoint vitkit loads (e.g. RUN/model); null = off
    kind: str = "hard"  # hard (CE against the teacher's arg-max, DeiT) | soft (tau^2 * KL, Hinton et al.)
    alpha: float = 0.5  # weight of the teacher term (1: the labels are not used)
    tau: float = 1.0  # temperature of the soft term
    num_heads: Optional[int] = None  # for teacher weight files that do not record it


# The range of each numeric recipe field that has one (None values mean "not set" and are not checked; every
# float must also be finite). Lists are checked element by element (data.std, optim.betas).
_RULES = {">0": (lambda v: v > 0, "a positive number"), ">=0": (lambda v: v >= 0, "a number >= 0"),
          "[0,1)": (lambda v: 0 <= v < 1, "a number in [0, 1)")}
RANGES = {
    **{k: ">0" for k in ("data.load_size", "data.eval_batch_size", "data.std", "optim.lr", "optim.batch_size",
                         "optim.accum_steps", "optim.eps", "schedule.epochs", "schedule.steps", "schedule.minutes",
                         "train.log_every", "init.num_heads", "distill.num_heads", "distill.tau", "mpp.bits")},
    # 0 means "off" or "the default" for these
    **{k: ">=0" for k in ("data.train_subset", "optim.clip_grad", "train.threads")},
    **{k: ">=0" for k in ("data.val_size", "data.val_seed", "data.workers", "optim.weight_decay", "optim.momentum",
                          "schedule.warmup_steps", "schedule.warmup_epochs", "schedule.min_lr", "train.seed",
                          "train.eval_every", "train.ckpt_every", "train.predictions", "mpp.eval_images",
                          "mpp.figure_images")},
    **{k: "[0,1)" for k in ("optim.betas", "data.val_fraction", "train.ema")},
}
AUTO_FIELDS = ("num_classes", "in_chans")  # model fields a recipe may leave to the dataset ("auto")
SECTIONS = {"data": DataConfig, "augment": AugmentConfig, "optim": OptimConfig, "schedule": ScheduleConfig,
            "train": TrainConfig, "init": InitConfig, "mpp": MPPConfig, "distill": DistillConfig}


@dataclass
class Recipe:
    name: str = "custom"
    description: str = ""
    model: Dict[str, Any] = field(default_factory=dict)  # arch: NAME plus any ViTConfig field
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    init: InitConfig = field(default_factory=InitConfig)
    mpp: MPPConfig = field(default_factory=MPPConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    # --- (de)serialisation ----------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """Every section as plain values (what recipe.yaml holds)."""
        d = {"name": self.name, "description": self.description, "model": copy.deepcopy(self.model)}
        for key in SECTIONS:
            d[key] = _plain(dataclasses.asdict(getattr(self, key)))
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Recipe":
        d = dict(d)
        d.pop("base", None)
        _check_keys(d, ["name", "description", "model"] + list(SECTIONS), "recipe")
        kw: Dict[str, Any] = {k: d[k] for k in ("name", "description") if k in d}
        model = d.get("model") or {}
        if not isinstance(model, dict):
            raise ConfigError(f"got {model!r}, expected a mapping of config fields", key="model")
        model = dict(model)
        if model.get("arch") is not None and not isinstance(model["arch"], str):
            raise ConfigError(f"got {model['arch']!r}, expected a model name such as 'B/16'", key="model.arch")
        # num_classes / in_chans may be "auto": taken from the dataset
        checked = check_fields({k: v for k, v in model.items()
                                if k != "arch" and not (k in AUTO_FIELDS and v == "auto")}, where="model.")
        model.update({k: v for k, v in checked.items() if model[k] is None})  # posemb=none: the name "none"
        kw["model"] = model
        for key, klass in SECTIONS.items():
            sec = d.get(key) or {}
            if not isinstance(sec, dict):
                raise ConfigError(f"got {sec!r}, expected a mapping of keys", key=key)
            names = [f.name for f in dataclasses.fields(klass)]
            _check_keys(sec, names, key)
            sec = {k: coerce_field(klass, k, v, f"{key}.{k}") for k, v in sec.items()}
            kw[key] = klass(**sec)
        recipe = cls(**kw)
        recipe.validate()
        return recipe

    def to_yaml(self) -> str:
        """The recipe as YAML text."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110)

    def save(self, path: PathLike) -> Path:
        """Write the recipe as YAML to ``path`` (atomically); returns the path."""
        path = Path(path)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n" if path.suffix == ".json" else self.to_yaml())
        return path

    # --- checks and derived values ------------------------------------------------------------
    def validate(self) -> None:
        """ConfigError naming the key for any value out of range or inconsistent with another."""
        o, s, t = self.optim, self.schedule, self.train
        if o.name not in ("adamw", "adam", "sgd"):
            raise ConfigError(f"optim.name={o.name!r}: use adamw, adam or sgd")
        self._check_ranges()
        if o.batch_size % o.accum_steps:
            raise ConfigError(f"optim.batch_size {o.batch_size} is not divisible by accum_steps {o.accum_steps}")
        if o.layer_decay is not None and not 0.0 < o.layer_decay <= 1.0:
            raise ConfigError(f"optim.layer_decay must be in (0, 1] (e.g. 0.75), or null for none; got {o.layer_decay}")
        if o.implementation not in ("auto", "fused", "foreach", "loop"):
            raise ConfigError(f"optim.implementation={o.implementation!r}: use auto, fused, foreach or loop")
        if s.decay not in ("cosine", "linear", "constant"):
            raise ConfigError(f"schedule.decay={s.decay!r}: use cosine, linear or constant")
        if s.steps is None and s.epochs is None:
            raise ConfigError("give schedule.epochs > 0 or schedule.steps")
        if s.patch_drop_end is not None and not 0 <= s.patch_drop_end < 1:
            raise ConfigError(f"schedule.patch_drop_end must be in [0, 1), got {s.patch_drop_end}")
        if not 0 <= s.patch_drop_from < 1:
            raise ConfigError(f"schedule.patch_drop_from must be in [0, 1) (a fraction of the run), got "
                             f"{s.patch_drop_from}")
        if t.precision not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"train.precision={t.precision!r}: use fp32, bf16 or fp16 (CUDA)")
        if t.distributed not in ("ddp", "fsdp"):
            raise ConfigError(f"train.distributed={t.distributed!r}: use ddp or fsdp")
        if t.export not in ("auto", "ema", "raw"):
            raise ConfigError(f"train.export={t.export!r}: use auto, ema or raw")
        bad = [name for name in t.log if name not in LOGGERS]
        if bad:
            raise ConfigError(f"train.log: unknown logger {bad[0]!r}: use {' and/or '.join(LOGGERS)}",
                              key="train.log")
        if self.init.head not in ("auto", "reset", "keep"):
            raise ConfigError(f"init.head={self.init.head!r}: use auto, reset or keep")
        dd = self.distill
        if dd.kind not in ("hard", "soft"):
            raise ConfigError(f"distill.kind={dd.kind!r}: use hard or soft")
        if not 0 < dd.alpha <= 1 or not dd.tau > 0:
            raise ConfigError(f"distill.alpha must be in (0, 1] and distill.tau positive, got alpha={dd.alpha}, "
                              f"tau={dd.tau}")
        check_mpp(self.mpp)
        if "arch" in self.model and self.model["arch"] is not None:
            config_from_name(str(self.model["arch"]))  # fails early on unknown names
        for key, value in self.model.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"got {value}, expected a finite number", key=f"model.{key}")
        if self.init.checkpoint is None:  # the whole architecture is here: build its config (sizes > 0 ...)
            self.model_config(num_classes=1, in_chans=1)  # placeholders for what "auto" takes from the data

    def _check_ranges(self) -> None:
        """Every number is finite, and the sizes, counts and rates of :data:`RANGES` are in range, before any
        work starts (a zero batch or an infinite learning rate would otherwise fail after data loading,
        or after training)."""
        for sec in SECTIONS:
            for f in dataclasses.fields(SECTIONS[sec]):
                value, key = getattr(getattr(self, sec), f.name), f"{sec}.{f.name}"
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(v, float) and not math.isfinite(v):
                        raise ConfigError(f"got {v}, expected a finite number", key=key)
                    rule = RANGES.get(key)
                    if rule is not None and isinstance(v, (int, float)) and not isinstance(v, bool) \
                            and not _RULES[rule][0](v):
                        raise ConfigError(f"got {v}, expected {_RULES[rule][1]}", key=key)

    def model_config(self, num_classes: Optional[int] = None, in_chans: Optional[int] = None,
                     base: Optional[ViTConfig] = None) -> ViTConfig:
        """The ViTConfig: ``base`` (a checkpoint's) or the ``arch`` name, with the recipe's fields on top;
        ``num_classes`` / ``in_chans`` "auto" (or absent) come from the dataset."""
        fields = {k: v for k, v in self.model.items() if k != "arch"}
        for key, value in (("num_classes", num_classes), ("in_chans", in_chans)):
            if fields.get(key, "auto") == "auto":
                if value is not None:
                    fields[key] = value
                else:
                    fields.pop(key, None)
        if base is not None:
            return base.replace(**fields)
        arch = self.model.get("arch")
        return config_from_name(arch, **fields) if arch else ViTConfig(**fields)


def check_mpp(m: MPPConfig) -> None:
    """The masked-patch-prediction section (its target and corruption rates)."""
    if m.target not in MPP_TARGETS:
        raise ConfigError(f"mpp.target={m.target!r}: use one of {', '.join(MPP_TARGETS)}")
    if not 0 < m.ratio <= 1 or m.p_mask < 0 or m.p_random < 0 or m.p_mask + m.p_random > 1:
        raise ConfigError(f"mpp: need 0 < ratio <= 1, p_mask, p_random >= 0 and p_mask + p_random <= 1 (got ratio "
                          f"{m.ratio}, p_mask {m.p_mask}, p_random {m.p_random})")
    if not 1 <= m.bits <= 8:
        raise ConfigError(f"mpp.bits must be 1..8, got {m.bits}")


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _check_keys(d: Dict[str, Any], allowed: List[str], where: str) -> None:
    for k in d:
        if k not in allowed:
            hint = difflib.get_close_matches(k, allowed, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown key {k!r} in {where}{extra} (known: {', '.join(allowed)})")


# --- named recipes --------------------------------------------------------------------------------
def list_recipes() -> List[str]:
    """Built-in recipe names; partial recipes (``_*.yaml``, only meant as a ``base:``) are left out."""
    return sorted(p.name[:-5] for p in resources.files(_RECIPE_PACKAGE).iterdir()
                  if p.name.endswith(".yaml") and not p.name.startswith("_"))


def _read_file(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise NotFoundError("recipe file not found", path=path) from None
    try:
        d = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({_one_line(err)})", path=path,
                          hint="fix the recipe file") from None
    if not isinstance(d, dict):
        raise ConfigError("a recipe must be a mapping of sections (model, data, optim, ...)", path=path)
    return d


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def raw_recipe(name_or_path: Union[str, PathLike], seen: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """A recipe as the plain dict its file holds, ``base:`` resolved; nothing validated (see :func:`load_recipe`)."""
    key = str(name_or_path)
    if key in seen:
        raise ConfigError(f"recipe inheritance loops: {' -> '.join(seen + (key,))}")
    p = Path(key)
    # a file path, or a name; a folder never shadows a built-in name (a run folder called
    # ``fmnist-long`` in the working directory must not hide the recipe of that name)
    if p.suffix in (".yaml", ".yml", ".json") or p.is_file():
        d = _read_file(p)
    else:
        res = resources.files(_RECIPE_PACKAGE).joinpath(f"{key}.yaml")
        if not res.is_file():
            names = list_recipes()
            hint = difflib.get_close_matches(key, names, n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown recipe {key!r}.{extra} Built-in recipes: {', '.join(names)}; or give a "
                              f".yaml/.json file")
        d = yaml.safe_load(res.read_text())
        d.setdefault("name", key)
    base = d.get("base")
    if base:
        parent = raw_recipe(base, seen + (key,))
        d = merge(parent, {k: v for k, v in d.items() if k != "base"})
    return d


def merge(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """``b`` over ``a``, section by section (one level of nesting; values replace, never concatenate)."""
    out = copy.deepcopy(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **copy.deepcopy(v)}
        else:
            out[k] = copy.deepcopy(v)
    return out


def apply_overrides(d: Dict[str, Any], overrides: Dict[str, Any]) -> Dict[str, Any]:
    """Set dotted keys (``optim.lr``) or unambiguous bare field names (``lr``) in a recipe dict."""
    out = copy.deepcopy(d)
    leaf_owner: Dict[str, List[str]] = {}
    for sec, klass in SECTIONS.items():
        for f in dataclasses.fields(klass):
            leaf_owner.setdefault(f.name, []).append(sec)
    for f in dataclasses.fields(ViTConfig):
        leaf_owner.setdefault(f.name, []).append("model")
    leaf_owner.setdefault("arch", []).append("model")
    for key, value in overrides.items():
        if "." in key:
            sec, _, leaf = key.partition(".")
        elif key in ("name", "description"):
            out[key] = value
            continue
        elif key == "model" or key in SECTIONS:  # a whole section: model={...} replaces the architecture
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{key}=... replaces the whole section: give a mapping, e.g. {key}={{...}}")
            out[key] = dict(value or {})
            continue
        else:
            owners = leaf_owner.get(key)
            if not owners:
                hint = difflib.get_close_matches(key, list(leaf_owner), n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else ""
                raise ConfigError(f"unknown recipe key {key!r}{extra}: use SECTION.KEY (e.g. optim.lr=3e-4)")
            if len(owners) > 1:
                raise ConfigError(f"{key!r} is in several sections ({', '.join(owners)}): write "
                                  f"{owners[0]}.{key}=... ")
            sec, leaf = owners[0], key
        if sec != "model" and sec not in SECTIONS:
            raise ConfigError(f"unknown recipe section {sec!r} in {key!r}: use one of model, {', '.join(SECTIONS)}")
        out.setdefault(sec, {})
        if out[sec] is None:
            out[sec] = {}
        out[sec][leaf] = value
    return out


def load_recipe(name_or_path: Union[str, PathLike] = DEFAULT_RECIPE, overrides: Optional[Dict[str, Any]] = None
                ) -> Recipe:
    """A built-in recipe by name or a recipe file, with ``overrides`` applied and everything validated."""
    d = raw_recipe(name_or_path)
    if overrides:
        d = apply_overrides(d, overrides)
    return Recipe.from_dict(d)
