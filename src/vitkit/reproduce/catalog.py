"""The arms and the ten claims of ``vitkit reproduce`` (data; the types are in :mod:`.claims`)."""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from . import analyses
from .budget import Budget
from .claims import (
    CLASSES_A,
    CLASSES_B,
    HYBRID,
    LARGE,
    LRS,
    RESNET,
    SPEED,
    TOKEN,
    TRANSFER_MODELS,
    Arm,
    AtBest,
    Best,
    Claim,
    Test,
    diff,
    interaction,
    lr_name,
    selector_arms,
    size_name,
)

SIZES = (1000, 6000, None)


def _shared(version: int, family: str) -> Optional[str]:
    """The sweep family of a fine-tune or a data size: its own (None) from v3 on, ``family`` in v2."""
    return None if version >= 3 else family


def arms_table(data_sizes: Tuple[Optional[int], ...] = SIZES, version: int = 3) -> Dict[str, Arm]:
    """Every arm. ``version`` 3 gives each fine-tune and each of claim 3's data sizes its own sweep (rate and
    schedule); 2 keeps the v2 sharing (a fine-tune at its parent's rate, every size at the rate of all images)."""
    ft = functools.partial(_shared, version)
    arms: List[Arm] = [
        Arm(name="vit", model={}, label="ViT (1D pos., GAP)", analysis=True),
        # claim 9: the same model at initialisation (attention statistics only)
        Arm(name="vit-init", model={}, kind="init", length="none", lr=0.0, label="ViT at initialisation",
            analysis=True),
        # claim 1: position embeddings (Table 8); variants of the base ViT share its learning-rate sweep
        Arm(name="pe-none", model={"posemb": "none"}, sweep="vit", label="no pos. emb."),
        Arm(name="pe-2d", model={"posemb": "learn2d"}, sweep="vit", label="2D"),
        Arm(name="pe-rel", model={"posemb": "relative"}, sweep="vit", label="relative"),
        Arm(name="pe-1d-every", model={"posemb_where": "every_layer"}, sweep="vit", label="1D, every layer"),
        Arm(name="pe-1d-shared", model={"posemb_where": "every_layer_shared"}, sweep="vit",
            label="1D, every layer, shared"),
        # claim 4: hybrids (Figure 5); claim 9 compares the hybrid's attention distances with the ViT's
        Arm(name="hybrid", model=HYBRID, label="R+ViT (hybrid)", analysis=True),
        Arm(name="vit-large", model=LARGE, label="ViT large"),
        Arm(name="hybrid-large", model={**HYBRID, **LARGE}, label="R+ViT large"),
        # claim 6: model shape (Figure 8)
        Arm(name="vit-p7", model={"patch_size": 7}, label="patch 7 (16 tokens)"),
        Arm(name="vit-deep", model={"depth": 8}, label="depth 8"),
        Arm(name="vit-wide", model={"width": 96, "mlp_dim": 192}, label="width 96"),
        # claim 7: axial attention (Figure 13)
        Arm(name="axial", model={"attention": "axial"}, label="Axial-ViT"),
        # claim 5: resolution (Table 2): pre-train at 20 px, fine-tune (at the parent's chosen rate)
        Arm(name="res-pre20", model={"img_size": 20}, label="pre-train 20 px"),
        Arm(name="res-ft20", model={"img_size": 20}, length="finetune", parent="res-pre20", sweep=ft("res-pre20"),
            label="fine-tune 20 px", overrides={"init.head": "reset"}),
        Arm(name="res-ft28", model={"img_size": 28}, length="finetune", parent="res-pre20", sweep=ft("res-pre20"),
            label="28 px, interpolated", overrides={"init.head": "reset"}),
        Arm(name="res-ft28-reinit", model={"img_size": 28}, length="finetune", parent="res-pre20",
            sweep=ft("res-pre20"), prepare="reinit_posemb", label="28 px, re-initialised",
            overrides={"init.head": "reset"}),
        # claim 8: masked patch prediction (Section 4.6); both 1k-label arms get their own sweep
        Arm(name="few-scratch", length="few_labels", label="1k labels, from scratch"),
        Arm(name="mpp", recipe="fmnist-mpp", length="mpp", kind="mpp", lr=1e-3, label="MPP pre-training"),
        Arm(name="few-mpp", length="few_labels", parent="mpp", label="1k labels, after MPP"),
    ]
    # claim 2: class token vs GAP over a learning-rate sweep (Figure 9)
    for lr in LRS:
        arms.append(Arm(name=f"gap-lr{lr_name(lr)}", model={}, lr=lr, label=f"GAP, lr {lr_name(lr)}", group="gap",
                        x=lr))
        arms.append(Arm(name=f"token-lr{lr_name(lr)}", model=TOKEN, lr=lr, label=f"class token, lr {lr_name(lr)}",
                        group="token", x=lr))
    # claim 3: data size (Figures 3-4), nested seeded subsets, the same optimiser steps at every size; each
    # model's rate is chosen at the full size
    for n in data_sizes:
        for name, model, lab in (("vit", {}, "ViT"), ("resnet", RESNET, "BiT ResNet")):
            arms.append(Arm(name=f"data-{name}-{size_name(n)}", model=model, length="data", train_images=n,
                            sweep=ft(f"data-{name}-{size_name(data_sizes[-1])}"), label=f"{lab}, {size_name(n)}",
                            group=name, x=float(n or 55000)))
    table = {a.name: a for a in arms}
    table.update(_transfer_arms(table, ft))
    return table


def _transfer_arms(table: Dict[str, Arm], ft: Any) -> Dict[str, Arm]:
    """Claim 10: pre-train on classes A, then few-shot probes and fine-tuning on classes B."""
    out: Dict[str, Arm] = {}
    for m in TRANSFER_MODELS:
        base = table[m]
        out[f"xfer-{m}"] = Arm(name=f"xfer-{m}", model=base.model, lr=base.lr, sweep=None if base.lr else base.family,
                               classes=CLASSES_A, probe_classes=CLASSES_B, label=f"{base.label}, on A")
        out[f"xfer-ft-{m}"] = Arm(name=f"xfer-ft-{m}", model=base.model, length="finetune", parent=f"xfer-{m}",
                                  lr=base.lr, sweep=None if base.lr else ft(base.family), classes=CLASSES_B,
                                  overrides={"init.head": "reset"}, label=f"{base.label}, fine-tuned on B")
    return out


# Each claim's prose: "N. TITLE", then its paper, setup, can and cannot paragraphs as "FIELD: TEXT" (an indented
# line continues the paragraph; white space folds to single spaces; {models}, {classes_a} and {classes_b} are
# filled in from .claims)
_PROSE_TEXT = """
1. Position embeddings (Appendix D.4, Table 8)
paper: No position embedding is clearly worse (ImageNet 5-shot 0.614 vs 0.642 for 1D); 1D, 2D and relative
    embeddings, at the input or at every layer, shared or not, are within ~0.003 of each other.
setup: The small ViT with each kind of position information; 5-shot and 10-shot linear accuracy on frozen features
    (the paper's metric) and fine-tuned test accuracy.
can: whether position information helps at all, and whether the kinds are interchangeable within one point, on a 7x7
    grid.
cannot: the 196-token regime of ViT-B/16; a 49-token grid may make the kinds matter differently (the v1 run found
    the no-embedding gap larger than the paper's, not smaller).

2. Class token vs global average pooling (Appendix D.3, Figure 9)
paper: With the learning rate tuned for the class token, GAP looks much worse; at its own (lower) learning rate GAP
    is as good as the class token.
setup: Both read-outs over a 3-point learning-rate sweep; each one's best rate chosen on the validation split, then
    compared on the test split.
can: whether the read-outs prefer different rates on a 3-point sweep; when both peak at the same rate the two
    comparisons are one contrast and the report counts it once.
cannot: the large-rate regime of long Adam runs where the paper saw GAP break down.

3. Data size and the convolutional inductive bias (Figures 3 and 4)
paper: BiT ResNets beat ViTs of similar cost when pre-trained on little data (ImageNet, 9M JFT images); ViT
    overtakes them from ~90M images.
setup: A BiT ResNet classifier (GroupNorm + weight-standardised convs) and the small ViT, trained for the same
    number of steps (equal training compute per model) on nested seeded subsets.
can: the trend: whether the ViT closes the gap to the ResNet as labelled data grows from 1k to 55k.
cannot: the crossover, which the paper puts at ~90M images, 1,500x our largest set.

4. Hybrids (Figure 5)
paper: A ResNet front-end helps at small compute (R50x1+ViT-B/32 above ViT-B/32 at ~100 exaFLOPs); the gap vanishes
    for larger models.
setup: A BiT ResNet stem (root + one bottleneck unit, 7x7 map, 1x1 patches) in front of the small and a larger ViT,
    against the same ViTs on 4x4 pixel patches; each arm at its own validation-chosen rate; accuracy against
    training compute in the figure.
can: the hybrid's gain at two small sizes (about 5x apart in compute); 'the gap shrinks' is only tested when the
    larger ViT is better than the small one.
cannot: ViT-L-sized hybrids or the exaFLOP range of Figure 5.

5. Fine-tuning at a higher resolution (Section 3.2, Table 2)
paper: Fine-tuning at a higher resolution than pre-training (384 vs 224 px) improves accuracy; the pre-trained
    position embeddings are 2D-interpolated to the longer sequence.
setup: Pre-train at 20 px (5x5 patches), then fine-tune at 20 px, at 28 px with the position embeddings
    interpolated, and at 28 px with them re-initialised (paired by parent run).
can: whether more pixels at fine-tuning help, and whether interpolated embeddings beat fresh ones.
cannot: the 224 to 384 px step; 20 px is Fashion-MNIST downsampled (the paper does not report the re-initialised
    case).

6. Model shape (Appendix D.2, Figure 8)
paper: A smaller patch (longer sequence) improves accuracy at (almost) the same parameter count; scaling depth helps
    more than scaling width.
setup: The small ViT at patch 4 vs 7 (same parameters, 49 vs 16 tokens), and at depth 8 vs width 96 (about the same
    multiply-adds); accuracy against training compute in the figure.
can: one step of each scaling direction from a 4-block, width-64 model.
cannot: the scaling curves from ViT-B upwards.

7. Axial attention (Appendix D.6, Figure 13)
paper: Axial-ViT reaches better accuracy than ViT at comparable FLOPs, but the naive implementation is much slower
    per second.
setup: Axial-ViT with 4 blocks against ViT with 4 and 8 blocks (the latter about the same multiply-adds); training
    speed timed side by side when the report is written (paired by timing round).
can: accuracy at equal multiply-adds, and the sign and size of the speed difference on this CPU (the table gives it
    in images/s; a few percent is not 'much slower').
cannot: the TPU speed of the paper's naive implementation; on a 7x7 grid rows are 7 tokens, so the timing measures
    kernel launches more than the attention pattern.

8. Masked patch prediction (Section 4.6)
paper: Self-supervised pre-training by masked patch prediction gives ViT-B/16 79.9% on ImageNet, +2% over training
    from scratch.
setup: MPP on the unlabelled training images (the validation images held out), then 1,000 labels, against the same
    1,000 labels from scratch; both 1k-label arms at their own validation-chosen rate, paired by seed (same subset).
can: whether MPP helps a small ViT with 1,000 labels against a tuned from-scratch baseline.
cannot: MPP at JFT scale or its gap to supervised pre-training.

9. Inside the model (Section 4.5, Figure 7, Appendix D.7)
paper: Some heads attend to most of the image already in the lowest layers while others are local; mean attention
    distance grows with depth; a hybrid's early layers are less local; learned 1D position embeddings show 2D
    row/column structure.
setup: Mean attention distances (pixels) on validation images of the trained base ViT, the same architecture at its
    initialisation (same seed), and the hybrid; cosine similarity of the position embeddings. An untrained model
    attends almost uniformly, so each statistic is compared with it.
can: whether training creates local heads, depth-wise growth and 2D embedding structure that an untrained model
    lacks.
cannot: 'global' in the paper's sense: a 28 px image spans at most ~35 pixels.

10. Few-shot linear accuracy predicts fine-tuning accuracy (Section 4.1)
paper: The paper uses linear few-shot accuracy as a cheap proxy for fine-tuned accuracy throughout (Figures 4, 5, 9,
    13, Table 8).
setup: Transfer: {models} architectures pre-trained on the 5 {classes_a} classes (t-shirt, pullover, coat, shirt,
    bag); 5-shot linear accuracy of their frozen features on the 5 {classes_b} ones (trouser, dress, sandal,
    sneaker, boot), against test accuracy after fine-tuning on those; Spearman rank correlation of the per-model
    seed means.
can: whether the proxy ranks models on classes they were not trained on.
cannot: transfer across datasets: Debian ships no second image dataset (only Fashion-MNIST) and the PyPI dataset
    packages (medmnist, emnist, ...) download their data; scikit-learn's wheel bundles 1,797 8x8 digits, too small
    and coarse for these models, so A and B are two halves of Fashion-MNIST.
"""


def _parse_prose(text: str) -> Dict[int, Dict[str, str]]:
    """:data:`_PROSE_TEXT` -> {claim id: {"title": ..., "paper": ..., "setup": ..., "can": ..., "cannot": ...}}."""
    values = {"models": len(TRANSFER_MODELS), "classes_a": CLASSES_A, "classes_b": CLASSES_B}
    out: Dict[int, Dict[str, str]] = {}
    fields: Dict[str, str] = {}
    key = ""
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            fields[key] += " " + line.strip()
        elif line[0].isdigit():
            number, title = line.split(". ", 1)
            fields = out[int(number)] = {"title": title}
        else:
            key, fields[key] = line.split(": ", 1)
    return {i: {k: v.format(**values) for k, v in claim.items()} for i, claim in out.items()}


_PROSE = _parse_prose(_PROSE_TEXT)


def _claim(id: int, **fields: Any) -> Claim:
    """Claim ``id``: its prose from :data:`_PROSE_TEXT`, the rest (arms, tests, figure, ...) from ``fields``."""
    return Claim(id=id, **_PROSE[id], **fields)


def claims_table(data_sizes: Tuple[Optional[int], ...] = SIZES) -> Dict[int, Claim]:
    small, big = size_name(data_sizes[0]), size_name(data_sizes[-1])
    cl = [
        _claim(1, arms=("pe-none", "vit", "pe-2d", "pe-rel", "pe-1d-every", "pe-1d-shared"),
               tests=(Test(text="1D beats none (5-shot)", weights=diff("vit", "pe-none"), metric="fewshot_5"),
                      Test(text="1D beats none (test)", weights=diff("vit", "pe-none")),
                      Test(text="2D ~ 1D", weights=diff("pe-2d", "vit"), expect="~"),
                      Test(text="relative ~ 1D", weights=diff("pe-rel", "vit"), expect="~"),
                      Test(text="1D every layer ~ 1D at the input", weights=diff("pe-1d-every", "vit"), expect="~"),
                      Test(text="1D every layer, shared ~ 1D at the input", weights=diff("pe-1d-shared", "vit"),
                           expect="~")),
               metric="fewshot_5"),
        _claim(2, arms=tuple(a for lr in LRS for a in (f"token-lr{lr_name(lr)}", f"gap-lr{lr_name(lr)}")),
               tests=(Test(text="at the class token's best lr, the class token beats GAP",
                           weights=diff(Best("token"), AtBest("gap", "token"))),
                      Test(text="each at its own best lr, GAP ~ class token",
                           weights=diff(Best("gap"), Best("token")), expect="~")),
               figure="lines"),
        _claim(3, arms=tuple(f"data-{m}-{size_name(n)}" for n in data_sizes for m in ("resnet", "vit")),
               tests=(Test(text=f"ResNet beats ViT on {small} images",
                           weights=diff(f"data-resnet-{small}", f"data-vit-{small}")),
                      Test(text=f"ViT gains more than the ResNet from {small} to {big} images",
                           weights=interaction(f"data-vit-{big}", f"data-resnet-{big}", f"data-vit-{small}",
                                               f"data-resnet-{small}"))),
               figure="lines"),
        _claim(4, arms=("vit", "hybrid", "vit-large", "hybrid-large"),
               tests=(Test(text="the hybrid beats the small ViT", weights=diff("hybrid", "vit")),
                      Test(text="the larger ViT beats the small one (precondition)", weights=diff("vit-large", "vit")),
                      Test(text="the hybrid's gain shrinks for the larger model",
                           weights=interaction("hybrid", "vit", "hybrid-large", "vit-large"),
                           requires=("the larger ViT beats the small one (precondition)",))),
               figure="compute"),
        _claim(5, arms=("res-pre20", "res-ft20", "res-ft28", "res-ft28-reinit"),
               tests=(Test(text="28 px (interpolated) beats 20 px", weights=diff("res-ft28", "res-ft20")),
                      Test(text="interpolated beats re-initialised", weights=diff("res-ft28", "res-ft28-reinit")))),
        _claim(6, arms=("vit-p7", "vit", "vit-wide", "vit-deep"),
               tests=(Test(text="patch 4 beats patch 7", weights=diff("vit", "vit-p7")),
                      Test(text="depth 8 beats width 96 at equal compute", weights=diff("vit-deep", "vit-wide"))),
               figure="compute"),
        _claim(7, arms=("vit", "vit-deep", "axial"),
               tests=(Test(text="Axial-ViT beats ViT at about the same multiply-adds",
                           weights=diff("axial", "vit-deep")),
                      Test(text="Axial-ViT is slower per second than ViT at about the same multiply-adds",
                           weights=diff("vit-deep", "axial"), metric=SPEED))),
        _claim(8, arms=("few-scratch", "few-mpp"),
               tests=(Test(text="MPP then 1k labels beats 1k labels from scratch",
                           weights=diff("few-mpp", "few-scratch")),)),
        _claim(9, arms=("vit", "vit-init", "hybrid"),
               tests=(Test(text="layer 0 has local heads that the untrained model lacks (min head distance / "
                                "uniform, at init minus trained)", weights=diff("vit-init", "vit"),
                           metric="l0_min_rel"),
                      Test(text="layer 0 mixes local and global heads (max minus min head distance / uniform) "
                                "more than at initialisation", weights=diff("vit", "vit-init"),
                           metric="l0_spread_rel"),
                      Test(text="attention distance grows with depth more than at initialisation",
                           weights=diff("vit", "vit-init"), metric="dist_growth"),
                      Test(text="the hybrid's first layer is less local than the ViT's", weights=diff("hybrid", "vit"),
                           metric="l0_mean_dist"),
                      Test(text="position embeddings: row/column structure beyond initialisation",
                           weights=diff("vit", "vit-init"), metric="posemb_rowcol")),
               figure="distance", metric="l0_mean_dist"),
        _claim(10, arms=tuple(a for m in TRANSFER_MODELS for a in (f"xfer-{m}", f"xfer-ft-{m}")),
               figure="scatter", metric="fewshot_5", analysis=analyses.transfer_correlation),
    ]
    return {c.id: c for c in cl}


def needed_arms(claims: Sequence[Claim], arms: Dict[str, Arm]) -> List[str]:
    """Arm names the claims need (a selector needs its whole group), parents first, each once."""
    out: List[str] = []

    def add(name: str) -> None:
        if name in out:
            return
        if arms[name].parent:
            add(arms[name].parent)
        out.append(name)

    for c in claims:
        for t in c.tests:
            for n, _ in t.weights:
                for m in selector_arms(n, arms):
                    add(m)
        for n in c.arms:
            add(n)
    return out


def plan(claim_ids: Optional[Sequence[int]], budget: Budget):
    """(claims asked for, the arm table, arm names to train in order)."""
    claims = claims_table(budget.data_sizes)
    arms = arms_table(budget.data_sizes, budget.version)
    ids = list(claim_ids) if claim_ids else sorted(claims)
    unknown = [i for i in ids if i not in claims]
    if unknown:
        raise ConfigError(f"unknown claim(s) {unknown}: the claims are {', '.join(map(str, sorted(claims)))}")
    chosen = [claims[i] for i in sorted(set(ids))]
    return chosen, arms, needed_arms(chosen, arms)
