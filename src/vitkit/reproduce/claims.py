"""The paper's claims as data: per claim, the arms that test it, the comparisons that decide it and any
claim-specific analysis.

An :class:`Arm` is one training configuration (a built-in recipe, model fields on top of the shared small
ViT, extra recipe overrides); it becomes one ordinary run folder per seed. Arms are named once and shared:
the base ViT serves claims 1, 2, 4, 6, 7 and 9. An arm's learning rate is either fixed (``lr``) or chosen
on the validation split by its family's sweep (``sweep``, run by :mod:`.sweep`). A :class:`Test` is a linear
contrast of arms on one metric with what the paper leads us to expect (``">"`` or ``"~"``) and the margin of
practical relevance; :mod:`.stats` turns it into a verdict. Arm names in a test may be selectors resolved on
validation accuracy (:class:`Best`, :class:`AtBest`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import ConfigError

# The shared small ViT for 28 px Fashion-MNIST: patch 4 (7x7 grid), width 64, 4 blocks of 4 heads, MLP 128,
# learned 1D position embeddings, global average pooling.
BASE_MODEL: Dict[str, Any] = {"img_size": 28, "patch_size": 4, "width": 64, "depth": 4, "num_heads": 4,
                              "mlp_dim": 128, "pool": "gap", "class_token": False, "posemb": "learn"}
TOKEN = {"pool": "token", "class_token": True}
HYBRID = {"backbone": "resnet", "backbone_layers": [1], "backbone_width": 32, "patch_size": 1}  # 7x7 map: 49 tokens
RESNET = {"backbone": "resnet", "backbone_layers": [2, 2], "backbone_width": 32, "patch_size": 1, "width": 128,
          "depth": 0, "posemb": "none"}  # BiT ResNet classifier
LARGE = {"width": 128, "depth": 6, "mlp_dim": 256}
LRS = (1e-3, 3e-3, 1e-2)  # claim 2's own sweep (both read-outs at every rate)
# Claim 10 (transfer): pre-train on classes A, probe and fine-tune on classes B: the even and the odd class
# indices (Fashion-MNIST: A = t-shirt, pullover, coat, shirt, bag; B = trouser, dress, sandal, sneaker, boot)
CLASSES_A, CLASSES_B = "even", "odd"
HALVES = {"even": 0, "odd": 1}
TRANSFER_MODELS = ("vit", "pe-none", "vit-p7", "vit-deep", "vit-wide", "hybrid", "token-lr3e-3")

# What an arm's length follows in the budget (vitkit.reproduce.budget.Budget)
LENGTHS = ("main", "finetune", "data", "mpp", "few_labels", "none")
SPEED = "paired_img_per_s"  # training images / s timed side by side at report time, one value per round


@dataclass(frozen=True)
class Arm:
    name: str
    recipe: str = "fmnist-1k"  # built-in recipe underneath (its augmentation, optimiser, schedule shape)
    model: Optional[Dict[str, Any]] = None  # model fields over BASE_MODEL (None: the recipe's own model)
    overrides: Dict[str, Any] = field(default_factory=dict)  # any other recipe keys (--set semantics)
    length: str = "main"
    kind: str = "train"  # train (classification) | mpp (masked patch prediction) | init (untrained weights)
    parent: Optional[str] = None  # fine-tune from this arm's exported model (same seed)
    prepare: Optional[str] = None  # "reinit_posemb": the parent's weights with position embeddings re-drawn
    train_images: Optional[int] = None  # claim 3's subset size (length "data"; None: everything)
    lr: Optional[float] = None  # a fixed learning rate (None: chosen by the sweep of family ``sweep``)
    sweep: Optional[str] = None  # the family whose validation sweep chooses the rate (None: this arm's own)
    classes: Optional[str] = None  # train and test on these classes only: "even" | "odd" class indices (claim 10)
    probe_classes: Optional[str] = None  # few-shot probes on these classes (default: ``classes``)
    label: str = ""  # short name in tables and figures
    group: str = ""  # arms that form one curve in a figure (and a selector's group)
    x: Optional[float] = None  # the arm's position on that curve (learning rate, data size, ...)
    analysis: bool = False  # also measure attention distances and position-embedding structure (claim 9)
    stretch: float = 1.0  # the budget's schedule times this (grown by the sweep until the arm converges)

    def full_model(self) -> Optional[Dict[str, Any]]:
        return None if self.model is None else {**BASE_MODEL, **self.model}

    @property
    def family(self) -> str:
        return self.sweep or self.name

    def at_lr(self, lr: float, stretch: float = 1.0) -> "Arm":
        """This arm with its rate fixed (a sweep point, or the sweep's choice), its schedule ``stretch`` times
        the budget's: run folder NAME@lrX (NAME@lrX-xS when stretched)."""
        tag = "" if stretch == 1 else f"-x{stretch:g}"
        return replace(self, name=f"{self.name}@lr{lr_name(lr)}{tag}", lr=lr, stretch=float(stretch))

    def at(self, lr: float, stretch: float = 1.0) -> "Arm":
        """A sweep point of this arm's family: :meth:`at_lr` for an arm whose rate the sweep chooses; an arm of
        fixed rate (``lr`` must be its own) keeps its name at the budget's schedule and is NAME@xS when its
        schedule is stretched S times (grown by the same convergence rule as a swept family)."""
        if self.lr is None:
            return self.at_lr(lr, stretch)
        if float(lr) != float(self.lr):
            raise ConfigError(f"arm {self.name} has the fixed rate {self.lr:g}, not {lr:g}")
        return self if stretch == 1 else replace(self, name=f"{self.name}@x{stretch:g}", stretch=float(stretch))

    @property
    def grows(self) -> bool:
        """A fixed-rate arm whose schedule the v3 sweep grows until it converges: one that trains (a classifier,
        or masked patch prediction) at a rate of its own."""
        return self.lr is not None and self.kind in ("train", "mpp") and self.length != "none"


@dataclass(frozen=True)
class Best:
    """Selector: the arm of ``group`` with the best mean validation accuracy."""

    group: str

    def candidates(self, arms: Dict[str, Arm]) -> List[str]:
        return [a.name for a in arms.values() if a.group == self.group]

    def resolve(self, groups: Dict[str, List[Tuple[float, str]]], val: Dict[str, Sequence[float]]) -> str:
        members = groups.get(self.group)
        if not members:
            raise ConfigError(f"{self}: no arms in group {self.group!r}")
        scored = [(_mean(val.get(arm, [])), -x, arm) for x, arm in members]
        scored = [s for s in scored if s[0] is not None]
        if not scored:
            raise ConfigError(f"{self}: no validation results yet")
        return max(scored)[2]  # ties: the smaller x

    def __str__(self) -> str:
        return f"best:{self.group}"


@dataclass(frozen=True)
class AtBest:
    """Selector: the arm of ``group`` at the x of ``Best(of)``."""

    group: str
    of: str

    def candidates(self, arms: Dict[str, Arm]) -> List[str]:
        return [a.name for a in arms.values() if a.group in (self.group, self.of)]

    def resolve(self, groups: Dict[str, List[Tuple[float, str]]], val: Dict[str, Sequence[float]]) -> str:
        chosen = Best(self.of).resolve(groups, val)
        x = dict((arm, xv) for xv, arm in groups[self.of])[chosen]
        for xv, arm in groups.get(self.group, []):
            if xv == x:
                return arm
        raise ConfigError(f"{self}: group {self.group!r} has no arm at x={x}")

    def __str__(self) -> str:
        return f"{self.group}@best:{self.of}"


Name = Union[str, Best, AtBest]


def _mean(vals: Sequence[float]) -> Optional[float]:
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class Test:
    """sum_i weight_i * (metric of arm i) compared with ``ref``, as ``expect`` says; ``margin`` is the
    smallest difference that matters (None: metric's default, :data:`MARGINS`); ``requires``: texts of
    tests of the same claim that must be reproduced first (else this one is underpowered: not testable)."""

    text: str
    weights: Tuple[Tuple[Name, float], ...]
    metric: str = "test_top1"
    expect: str = ">"
    ref: float = 0.0
    margin: Optional[float] = None
    requires: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Claim:
    id: int
    title: str
    paper: str  # the paper's statement and numbers
    setup: str  # our set-up in a sentence or two
    arms: Tuple[str, ...]  # arm names (figure order)
    tests: Tuple[Test, ...] = ()
    figure: str = "bars"  # bars | lines (x = Arm.x per group) | compute | scatter | distance
    metric: str = "test_top1"  # what the table and figure show first
    can: str = ""  # what this scale can test
    cannot: str = ""  # what it cannot
    analysis: Optional[Callable[..., Dict[str, Any]]] = None  # a claim-specific analysis (.analyses)


def diff(a: Name, b: Name) -> Tuple[Tuple[Name, float], ...]:
    return ((a, 1.0), (b, -1.0))


def interaction(a1: str, b1: str, a2: str, b2: str) -> Tuple[Tuple[Name, float], ...]:
    """(a1 - b1) - (a2 - b2): does the gap between a and b change from setting 2 to setting 1?"""
    return ((a1, 1.0), (b1, -1.0), (a2, -1.0), (b2, 1.0))


def lr_name(lr: float) -> str:
    """3e-3, 2.5e-4, 1.6e-2: up to 4 significant digits (a grown grid halves and doubles rates)."""
    mant, exp = f"{lr:.3e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


def size_name(n: Optional[int]) -> str:
    return "all" if n is None else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def same_run(a: Arm, b: Arm) -> bool:
    """Two names for one run: the same training and the same probes (the base ViT is claim 2's GAP arm at its
    chosen rate); the run is measured with the analyses either asks for."""
    def key(x: Arm):
        return (x.recipe, x.full_model(), x.overrides, x.length, x.kind, x.parent, x.prepare, x.train_images,
                x.lr, x.sweep if x.lr is None else None, x.classes, x.probe_classes, x.stretch)
    return key(a) == key(b)


def selector_arms(name: Name, arms: Dict[str, Arm]) -> List[str]:
    """Every arm a name may resolve to (a selector needs its whole group)."""
    return [name] if isinstance(name, str) else name.candidates(arms)


METRIC_LABELS = {SPEED: "images / s, side by side", "test_top1": "test top-1", "val_top1": "validation top-1",
                 "fewshot_5": "5-shot linear", "fewshot_10": "10-shot linear", "train_macs": "training compute",
                 "late_gain": "validation gain in the last quarter",
                 "l0_max_rel": "layer-0 max head distance / uniform",
                 "l0_min_rel": "layer-0 min head distance / uniform",
                 "l0_spread_rel": "layer-0 head spread / uniform", "dist_growth": "distance growth (px)",
                 "l0_mean_dist": "layer-0 mean distance (px)", "posemb_rowcol": "row/column similarity excess",
                 "slope": "fine-tuned accuracy per unit of 5-shot accuracy"}
PERCENT = {"test_top1", "val_top1", "fewshot_5", "fewshot_10", "late_gain"}  # shares, shown in percent
# the smallest difference that matters, per metric (stated in the report)
MARGINS = {"test_top1": 0.01, "val_top1": 0.01, "fewshot_5": 0.01, "fewshot_10": 0.01, "l0_min_rel": 0.1,
           "l0_spread_rel": 0.1, "dist_growth": 1.0, "l0_mean_dist": 1.0, "posemb_rowcol": 0.05, SPEED: None}


def parents_first(arms: Mapping[str, "Arm"], names: Optional[Iterable[str]] = None) -> List[str]:
    """``names`` (default: every arm) with each arm's parents before it, each once, in first-needed order."""
    out: List[str] = []

    def add(n: str) -> None:
        if n not in out:
            if arms[n].parent:
                add(arms[n].parent)
            out.append(n)
    for n in (arms if names is None else names):
        add(n)
    return out

