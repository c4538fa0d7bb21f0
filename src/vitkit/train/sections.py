"""The sections of a recipe (``data``, ``optim``, ``schedule``, ``train``, ``init``, ``mpp``, ``distill``; ``augment``
is :class:`vitkit.data.augment.AugmentConfig`): their fields with defaults and meaning, and the checks of
their values that need no other section (ranges, the MPP rates). :mod:`vitkit.train.recipe` puts them
together into a :class:`~vitkit.train.recipe.Recipe`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from ..data.augment import AugmentConfig
from ..errors import ConfigError
from ..models.mpp import MPP_TARGETS


@dataclass
class DataConfig:
    # fashion-mnist | mnist | cifar10:DIR | cifar100:DIR | folder:DIR | shards:PATTERN | tensors:FILE
    dataset: Optional[str] = "fashion-mnist"
    root: Optional[str] = None  # folder for specs without a path (e.g. Fashion-MNIST elsewhere)
    train_split: str = "train"
    # the test split, read once at the end: auto (the dataset's test split, else its val split, else none),
    # a split name, or null (none); the split used is recorded in results.json
    eval_split: Optional[str] = "auto"
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
    test_subset: Optional[int] = None  # test on a fixed class-stratified subset (seed 0, the same for every run)
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
    eval_ema: bool = True  # those evaluations score the EMA weights too (false: the raw weights only; the final
    # evaluation on validation still scores both, as the exported weights are chosen there)
    ckpt_every: int = 500  # steps between checkpoints (0 = end of epochs and run only)
    log_every: int = 50  # steps between metric lines
    deterministic: bool = False  # torch deterministic algorithms (exact resume on GPU too); pins the backend
    # the kernels (vitkit.models.kernel_plan): e.g. "gemm=aten,attention=fused"; null = the one in force when the run
    # starts ($VITKIT_BACKEND, else auto). A set value wins over the environment; the training commands' --backend
    # sets this field. The run folder's recipe.yaml records the spec it ran with.
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
    **{k: ">=0" for k in ("data.train_subset", "data.test_subset", "optim.clip_grad", "train.threads")},
    **{k: ">=0" for k in ("data.val_size", "data.val_seed", "data.workers", "optim.weight_decay", "optim.momentum",
                          "schedule.warmup_steps", "schedule.warmup_epochs", "schedule.min_lr", "train.seed",
                          "train.eval_every", "train.ckpt_every", "train.predictions", "mpp.eval_images",
                          "mpp.figure_images")},
    **{k: "[0,1)" for k in ("optim.betas", "data.val_fraction", "train.ema")},
}
SECTIONS = {"data": DataConfig, "augment": AugmentConfig, "optim": OptimConfig, "schedule": ScheduleConfig,
            "train": TrainConfig, "init": InitConfig, "mpp": MPPConfig, "distill": DistillConfig}


def check_ranges(recipe: Any) -> None:
    """Every number of ``recipe``'s sections is finite, and the sizes, counts and rates of :data:`RANGES` are in
    range, before any work starts (a zero batch or an infinite learning rate would otherwise fail after data
    loading, or after training)."""
    for sec in SECTIONS:
        for f in dataclasses.fields(SECTIONS[sec]):
            value, key = getattr(getattr(recipe, sec), f.name), f"{sec}.{f.name}"
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"got {v}, expected a finite number", key=key)
                rule = RANGES.get(key)
                if rule is not None and isinstance(v, (int, float)) and not isinstance(v, bool) \
                        and not _RULES[rule][0](v):
                    raise ConfigError(f"got {v}, expected {_RULES[rule][1]}", key=key)


def check_mpp(m: MPPConfig) -> None:
    """The masked-patch-prediction section (its target and corruption rates)."""
    if m.target not in MPP_TARGETS:
        raise ConfigError(f"mpp.target={m.target!r}: use one of {', '.join(MPP_TARGETS)}")
    if not 0 < m.ratio <= 1 or m.p_mask < 0 or m.p_random < 0 or m.p_mask + m.p_random > 1:
        raise ConfigError(f"mpp: need 0 < ratio <= 1, p_mask, p_random >= 0 and p_mask + p_random <= 1 (got ratio "
                          f"{m.ratio}, p_mask {m.p_mask}, p_random {m.p_random})")
    if not 1 <= m.bits <= 8:
        raise ConfigError(f"mpp.bits must be 1..8, got {m.bits}")
