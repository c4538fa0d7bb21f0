"""Recipes: named, printable, overridable training configurations.

A recipe is a YAML (or JSON) file with the sections ``model``, ``data``, ``augment``, ``optim``,
``schedule``, ``train``, ``init`` (and ``mpp`` / ``distill`` for those objectives). ``base: NAME``
inherits another recipe and changes only what it lists. Built-in recipes live in ``vitkit/recipes/*.yaml``
(``paper-pretrain``, ``paper-finetune``, ``deit``, ``plain-baseline``, ``fmnist-*``). Overrides are dotted
keys (``optim.lr=3e-4``) or, when unambiguous, bare field names (``lr=3e-4``). The resolved recipe is saved
in every run folder.
The sections' fields and the checks each needs alone are in :mod:`vitkit.train.sections`.
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

from ..config import AUTO_FIELDS, ViTConfig, check_fields, coerce_field, config_from_name, section_config
from ..data.augment import AugmentConfig
from ..errors import ConfigError, NotFoundError
from ..utils import PathLike, atomic_path
from .loggers import LOGGERS
from .sections import (
    SECTIONS,
    DataConfig,
    DistillConfig,
    InitConfig,
    MPPConfig,
    OptimConfig,
    ScheduleConfig,
    TrainConfig,
    check_mpp,
    check_ranges,
)

_RECIPE_PACKAGE = "vitkit.recipes"
DEFAULT_RECIPE = "fmnist-demo"  # what `vitkit train` and load_recipe() train without a recipe (make demo)


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
        check_ranges(self)
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


    def model_config(self, num_classes: Optional[int] = None, in_chans: Optional[int] = None,
                     base: Optional[ViTConfig] = None) -> ViTConfig:
        """The ViTConfig: ``base`` (a checkpoint's) or the ``arch`` name, with the recipe's fields on top;
        ``num_classes`` / ``in_chans`` "auto" (or absent) come from the dataset
        (:func:`vitkit.config.section_config`)."""
        return section_config(self.model, num_classes, in_chans, base=base)


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
