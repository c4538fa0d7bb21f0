"""The paper's claims as data: per claim, the arms that test it and the comparisons that decide it.

An :class:`Arm` is one training configuration (a built-in recipe, model fields on top of the shared small
ViT, extra recipe overrides); it becomes one ordinary run folder per seed. Arms are named once and shared:
the base ViT serves claims 1, 2, 4, 6, 7 and 9, so it is trained once per seed. A :class:`Test` is a linear
contrast of arm means on one metric (``a - b``, or a difference of differences) with what the paper leads
us to expect: ``">"`` (positive) or ``"~"`` (no difference larger than the margin); claim 10 is a rank
correlation over all trained models. :mod:`vitkit.reproduce.stats` turns them into verdicts.

Arm names may be selectors resolved on the validation split: ``best:GROUP`` is the arm of ``GROUP`` with the
best mean validation accuracy, ``GROUP@best:OTHER`` the arm of ``GROUP`` at the same ``x`` (e.g. learning
rate) as ``best:OTHER``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

# The shared small ViT for 28 px Fashion-MNIST: patch 4 (7x7 grid), width 64, 4 blocks of 4 heads, MLP 128,
# learned 1D position embeddings, global average pooling; 0.14 M parameters, 7.7 M multiply-adds per image.
BASE_MODEL: Dict[str, Any] = {"img_size": 28, "patch_size": 4, "width": 64, "depth": 4, "num_heads": 4,
                              "mlp_dim": 128, "pool": "gap", "class_token": False, "posemb": "learn"}
TOKEN = {"pool": "token", "class_token": True}
HYBRID = {"backbone": "resnet", "backbone_layers": [1], "backbone_width": 32, "patch_size": 1}  # 7x7 map: 49 tokens
RESNET = {"backbone": "resnet", "backbone_layers": [2, 2], "backbone_width": 32, "patch_size": 1, "width": 128,
          "depth": 0, "posemb": "none"}  # BiT ResNet classifier, 5.5 M multiply-adds
LARGE = {"width": 128, "depth": 6, "mlp_dim": 256}
LRS = (1e-3, 3e-3, 1e-2)  # claim 2's sweep; 3e-3 is every other arm's rate (fmnist-1k's)

# What an arm's length follows in the budget (vitkit.reproduce.budget.Budget)
LENGTHS = ("main", "finetune", "data", "mpp", "few_labels")


@dataclass(frozen=True)
class Arm:
    name: str
    recipe: str = "fmnist-1k"  # built-in recipe underneath (its augmentation, optimiser, schedule shape)
    model: Optional[Dict[str, Any]] = None  # model fields over BASE_MODEL (None: the recipe's own model)
    overrides: Dict[str, Any] = field(default_factory=dict)  # any other recipe keys (--set semantics)
    length: str = "main"
    kind: str = "train"  # train (classification) | mpp (masked patch prediction, no labels)
    parent: Optional[str] = None  # fine-tune from this arm's exported model (same seed)
    prepare: Optional[str] = None  # "reinit_posemb": the parent's weights with position embeddings re-drawn
    train_images: Optional[int] = None  # claim 3's subset size (length "data"; None: everything)
    label: str = ""  # short name in tables and figures
    group: str = ""  # arms that form one curve in a figure (and a selector's group)
    x: Optional[float] = None  # the arm's position on that curve (learning rate, data size, ...)
    analysis: bool = False  # also measure attention distances and position-embedding structure (claim 9)

    def full_model(self) -> Optional[Dict[str, Any]]:
        return None if self.model is None else {**BASE_MODEL, **self.model}


@dataclass(frozen=True)
class Test:
    """sum_i weight_i * mean(metric of arm i) compared with ``ref``, as ``expect`` says."""

    text: str
    weights: Tuple[Tuple[str, float], ...]
    metric: str = "test_top1"
    expect: str = ">"  # ">" the contrast exceeds ref; "~" it is within the margin of ref
    ref: float = 0.0


@dataclass(frozen=True)
class Claim:
    id: int
    title: str
    paper: str  # the paper's statement and numbers
    setup: str  # our set-up in a sentence or two
    arms: Tuple[str, ...]  # arm names (figure order)
    tests: Tuple[Test, ...] = ()
    figure: str = "bars"  # bars | lines (x = Arm.x per group) | scatter (claim 10) | distance (claim 9)
    metric: str = "test_top1"  # what the table and figure show first
    limits: str = ""  # what this scale cannot test


def diff(a: str, b: str) -> Tuple[Tuple[str, float], ...]:
    return ((a, 1.0), (b, -1.0))


def interaction(a1: str, b1: str, a2: str, b2: str) -> Tuple[Tuple[str, float], ...]:
    """(a1 - b1) - (a2 - b2): does the gap between a and b change from setting 2 to setting 1?"""
    return ((a1, 1.0), (b1, -1.0), (a2, -1.0), (b2, 1.0))


def _lr(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")  # 3e-3


def _size(n: Optional[int]) -> str:
    return "all" if n is None else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def arms_table(data_sizes: Tuple[Optional[int], ...] = (1000, 6000, None)) -> Dict[str, Arm]:
    arms: List[Arm] = [
        Arm("vit", model={}, label="ViT (1D pos., GAP)", analysis=True),
        # claim 1: position embeddings (Table 8)
        Arm("pe-none", model={"posemb": "none"}, label="no pos. emb."),
        Arm("pe-2d", model={"posemb": "learn2d"}, label="2D"),
        Arm("pe-rel", model={"posemb": "relative"}, label="relative"),
        Arm("pe-1d-every", model={"posemb_where": "every_layer"}, label="1D, every layer"),
        Arm("pe-1d-shared", model={"posemb_where": "every_layer_shared"}, label="1D, every layer, shared"),
        # claim 4: hybrids (Figure 5); claim 9 compares the hybrid's attention distances with the ViT's
        Arm("hybrid", model=HYBRID, label="R+ViT (hybrid)", analysis=True),
        Arm("vit-large", model=LARGE, label="ViT large"),
        Arm("hybrid-large", model={**HYBRID, **LARGE}, label="R+ViT large"),
        # claim 6: model shape (Figure 8)
        Arm("vit-p7", model={"patch_size": 7}, label="patch 7 (16 tokens)"),
        Arm("vit-deep", model={"depth": 8}, label="depth 8"),
        Arm("vit-wide", model={"width": 96, "mlp_dim": 192}, label="width 96"),
        # claim 7: axial attention (Figure 13)
        Arm("axial", model={"attention": "axial"}, label="Axial-ViT"),
        # claim 5: resolution (Table 2): pre-train at 20 px, fine-tune at 20 or 28 px
        Arm("res-pre20", model={"img_size": 20}, label="pre-train 20 px"),
        Arm("res-ft20", model={"img_size": 20}, length="finetune", parent="res-pre20", label="fine-tune 20 px",
            overrides={"init.head": "reset"}),
        Arm("res-ft28", model={"img_size": 28}, length="finetune", parent="res-pre20",
            label="28 px, interpolated", overrides={"init.head": "reset"}),
        Arm("res-ft28-reinit", model={"img_size": 28}, length="finetune", parent="res-pre20",
            prepare="reinit_posemb", label="28 px, re-initialised", overrides={"init.head": "reset"}),
        # claim 8: masked patch prediction (Section 4.6; benchmarks/mpp_few_labels.py's experiment)
        Arm("few-scratch", recipe="fmnist-1k", length="few_labels", label="1k labels, from scratch"),
        Arm("mpp", recipe="fmnist-mpp", length="mpp", kind="mpp", label="MPP pre-training"),
        Arm("few-mpp", recipe="fmnist-1k", length="few_labels", parent="mpp", label="1k labels, after MPP"),
    ]
    # claim 2: class token vs GAP over a learning-rate sweep (Figure 9)
    for lr in LRS:
        lr_s = _lr(lr)
        if lr != 3e-3:
            arms.append(Arm(f"gap-lr{lr_s}", model={}, overrides={"optim.lr": lr}, label=f"GAP, lr {lr_s}",
                            group="gap", x=lr))
        arms.append(Arm(f"token-lr{lr_s}", model=TOKEN, overrides={"optim.lr": lr}, label=f"class token, lr {lr_s}",
                        group="token", x=lr))
    # claim 3: data size (Figures 3-4), nested seeded subsets, the same optimiser steps at every size
    for n in data_sizes:
        for name, model, lab in (("vit", {}, "ViT"), ("resnet", RESNET, "BiT ResNet")):
            arms.append(Arm(f"data-{name}-{_size(n)}", model=model, length="data", train_images=n,
                            label=f"{lab}, {_size(n)}", group=name, x=float(n or 55000)))
    table = {a.name: a for a in arms}
    # the base ViT is also the GAP arm at lr 3e-3
    table["gap-lr3e-3"] = Arm("gap-lr3e-3", model={}, label="GAP, lr 3e-3", group="gap", x=3e-3)
    return table


def same_run(a: Arm, b: Arm) -> bool:
    """Two names for one configuration (the base ViT is claim 2's GAP arm at lr 3e-3)."""
    return (a.recipe, a.full_model(), a.overrides, a.length, a.kind, a.parent, a.prepare, a.train_images) == \
        (b.recipe, b.full_model(), b.overrides, b.length, b.kind, b.parent, b.prepare, b.train_images)


def claims_table(data_sizes: Tuple[Optional[int], ...] = (1000, 6000, None)) -> Dict[int, Claim]:
    small, big = _size(data_sizes[0]), _size(data_sizes[-1])
    cl = [
        Claim(1, "Position embeddings (Appendix D.4, Table 8)",
              "No position embedding is clearly worse (ImageNet 5-shot 0.614 vs 0.642 for 1D); 1D, 2D and relative "
              "embeddings, at the input or at every layer, shared or not, are within ~0.003 of each other.",
              "The small ViT with each kind of position information; 5-shot and 10-shot linear accuracy on frozen "
              "features (the paper's metric) and fine-tuned test accuracy.",
              ("pe-none", "vit", "pe-2d", "pe-rel", "pe-1d-every", "pe-1d-shared"),
              (Test("1D beats none (5-shot)", diff("vit", "pe-none"), "fewshot_5"),
               Test("1D beats none (test)", diff("vit", "pe-none")),
               Test("2D ~ 1D", diff("pe-2d", "vit"), expect="~"),
               Test("relative ~ 1D", diff("pe-rel", "vit"), expect="~"),
               Test("1D every layer ~ 1D at the input", diff("pe-1d-every", "vit"), expect="~"),
               Test("1D every layer, shared ~ 1D at the input", diff("pe-1d-shared", "vit"), expect="~")),
              metric="fewshot_5",
              limits="A 7x7 patch grid is small: position information matters less with 49 tokens than with 196, "
                     "so the gap between 'none' and the rest may be smaller than the paper's."),
        Claim(2, "Class token vs global average pooling (Appendix D.3, Figure 9)",
              "With the learning rate tuned for the class token, GAP looks much worse; at its own (lower) "
              "learning rate GAP is as good as the class token.",
              "Both read-outs over a 3-point learning-rate sweep; each one's best rate chosen on the validation "
              "split, then compared on the test split.",
              tuple(a for lr in LRS for a in (f"token-lr{_lr(lr)}", f"gap-lr{_lr(lr)}")),
              (Test("at the class token's best lr, the class token beats GAP",
                    diff("best:token", "gap@best:token")),
               Test("each at its own best lr, GAP ~ class token", diff("best:gap", "best:token"), expect="~")),
              figure="lines",
              limits="The paper's effect comes from a large-lr regime of long Adam runs; a 3-point sweep of short "
                     "runs may not reach the rates where GAP breaks down."),
        Claim(3, "Data size and the convolutional inductive bias (Figures 3 and 4)",
              "BiT ResNets beat ViTs of similar cost when pre-trained on little data (ImageNet, 9M JFT images); "
              "ViT overtakes them from ~90M images: 'the convolutional inductive bias is useful for smaller "
              "datasets, but for larger ones learning the relevant patterns directly from data is sufficient'.",
              "A BiT ResNet classifier (GroupNorm + weight-standardised convs, depth=0 in vitkit's config) and "
              "the small ViT, trained for the same number of steps on nested seeded subsets.",
              tuple(f"data-{m}-{_size(n)}" for n in data_sizes for m in ("resnet", "vit")),
              (Test(f"ResNet beats ViT on {small} images", diff(f"data-resnet-{small}", f"data-vit-{small}")),
               Test(f"ViT gains more than the ResNet from {small} to {big} images",
                    interaction(f"data-vit-{big}", f"data-resnet-{big}", f"data-vit-{small}",
                                f"data-resnet-{small}"))),
              figure="lines",
              limits="60k images is far below the paper's 90M-image crossover: at most the trend (ViT catching "
                     "up as data grows) can show, not the crossover itself."),
        Claim(4, "Hybrids (Figure 5)",
              "A ResNet front-end helps at small compute (R50x1+ViT-B/32 above ViT-B/32 at ~100 exaFLOPs); the "
              "gap vanishes for larger models.",
              "A BiT ResNet stem (root + one bottleneck unit, 7x7 map, 1x1 patches) in front of the small and a "
              "larger ViT, against the same ViTs on 4x4 pixel patches.",
              ("vit", "hybrid", "vit-large", "hybrid-large"),
              (Test("the hybrid beats the small ViT", diff("hybrid", "vit")),
               Test("the hybrid's gain shrinks for the larger model",
                    interaction("hybrid", "vit", "hybrid-large", "vit-large"))),
              limits="Both of our models are tiny compared with ViT-B/32; the 'larger' one is only ~5x the "
                     "compute."),
        Claim(5, "Fine-tuning at a higher resolution (Section 3.2, Table 2)",
              "Fine-tuning at a higher resolution than pre-training (384 vs 224 px) improves accuracy; the "
              "pre-trained position embeddings are 2D-interpolated to the longer sequence.",
              "Pre-train at 20 px (5x5 patches), then fine-tune at 20 px, at 28 px with the position "
              "embeddings interpolated, and at 28 px with them re-initialised.",
              ("res-pre20", "res-ft20", "res-ft28", "res-ft28-reinit"),
              (Test("28 px (interpolated) beats 20 px", diff("res-ft28", "res-ft20")),
               Test("interpolated beats re-initialised", diff("res-ft28", "res-ft28-reinit"))),
              limits="20 px is Fashion-MNIST downsampled, so the 28 px fine-tune sees real extra detail as in the "
                     "paper; the paper does not report the re-initialised case (its Section 3.2 only argues for "
                     "interpolation)."),
        Claim(6, "Model shape (Appendix D.2, Figure 8)",
              "A smaller patch (longer sequence) improves accuracy at (almost) the same parameter count; scaling "
              "depth helps more than scaling width.",
              "The small ViT at patch 4 vs 7 (same parameters, 49 vs 16 tokens), and at depth 8 vs width 96 "
              "(about the same multiply-adds).",
              ("vit-p7", "vit", "vit-wide", "vit-deep"),
              (Test("patch 4 beats patch 7", diff("vit", "vit-p7")),
               Test("depth 8 beats width 96 at equal compute", diff("vit-deep", "vit-wide"))),
              limits="Four blocks of width 64 is a tiny starting point; the paper scales from ViT-B."),
        Claim(7, "Axial attention (Appendix D.6, Figure 13)",
              "Axial-ViT (row attention + MLP, then column attention + MLP, per block) reaches better accuracy "
              "than ViT at comparable FLOPs, but the naive implementation is much slower per second.",
              "Axial-ViT with 4 blocks against ViT with 4 blocks and ViT with 8 blocks (about the same "
              "multiply-adds as the axial model); training speed timed side by side when the report is written "
              "(each model's optimiser step on a synthetic batch, the three alternated over several rounds).",
              ("vit", "vit-deep", "axial"),
              (Test("Axial-ViT beats ViT at about the same multiply-adds", diff("axial", "vit-deep")),
               Test("Axial-ViT is slower per second than ViT at about the same multiply-adds",
                    diff("vit-deep", "axial"), metric=SPEED)),
              limits="On a 7x7 grid rows are only 7 tokens long, so attention is a small part of the cost and the "
                     "speed comparison measures the extra kernel launches more than the attention pattern."),
        Claim(8, "Masked patch prediction (Section 4.6)",
              "Self-supervised pre-training by masked patch prediction gives ViT-B/16 79.9% on ImageNet, +2% over "
              "training from scratch (4% below supervised pre-training).",
              "vitkit's few-labels experiment (benchmarks/mpp_few_labels.py): MPP on the unlabelled training "
              "images, then 1,000 labels, against the same 1,000 labels from scratch (recipe fmnist-1k).",
              ("few-scratch", "few-mpp"),
              (Test("MPP then 1k labels beats 1k labels from scratch", diff("few-mpp", "few-scratch")),),
              limits="The earlier 3-seed run of this experiment measured +1.5 points."),
        Claim(9, "Inside the model (Section 4.5, Figure 7, Appendix D.7)",
              "Some heads attend to most of the image already in the lowest layers; mean attention distance grows "
              "with depth; a hybrid's early layers are less local; learned 1D position embeddings show 2D "
              "row/column structure.",
              "Mean attention distances (pixels) of the base ViT and the hybrid on validation images; cosine "
              "similarity of the base ViT's position embeddings.",
              ("vit", "hybrid"),
              (Test("a layer-0 head attends globally (>= 75% of uniform attention's distance)",
                    (("vit", 1.0),), metric="l0_max_rel", ref=0.75),
               Test("attention distance grows with depth (last minus first layer)", (("vit", 1.0),),
                    metric="dist_growth"),
               Test("the hybrid's first layer is less local than the ViT's", diff("hybrid", "vit"),
                    metric="l0_mean_dist"),
               Test("position embeddings: same row/column more similar than other pairs", (("vit", 1.0),),
                    metric="posemb_rowcol")),
              figure="distance", metric="l0_mean_dist",
              limits="A 28 px image spans at most ~35 pixels, so 'global' and 'local' are close together."),
        Claim(10, "Few-shot linear accuracy tracks fine-tuning accuracy (Section 4.1)",
              "The paper uses linear few-shot accuracy as a cheap proxy for fine-tuned accuracy throughout "
              "(Figures 4, 5, 9, 13, Table 8).",
              "Spearman rank correlation, over every supervised model trained above, between 5-shot linear "
              "accuracy on frozen features and test accuracy.",
              (), figure="scatter", metric="fewshot_5",
              limits="All models share one dataset; the paper's claim spans many."),
    ]
    return {c.id: c for c in cl}


# Metrics the report knows how to label
# Training images per second timed side by side at report time (vitkit.reproduce.runner.paired_speed); one
# value per alternating round instead of per seed. Tests on this metric compare speeds on one machine.
SPEED = "paired_img_per_s"
METRIC_LABELS = {SPEED: "images / s, side by side", "test_top1": "test top-1", "val_top1": "validation top-1", "fewshot_5": "5-shot linear",
                 "fewshot_10": "10-shot linear", "img_per_s": "training images / s",
                 "l0_max_rel": "layer-0 max head distance / uniform", "dist_growth": "distance growth (px)",
                 "l0_mean_dist": "layer-0 mean distance (px)", "posemb_rowcol": "row/column similarity excess"}
