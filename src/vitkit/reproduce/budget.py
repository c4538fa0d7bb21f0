"""How long and how often every arm runs: the ``quick`` and ``full`` budgets, the learning-rate sweep they
pay for, the adapter that tells the training engine to hold a validation split out of the training set, and
an estimate of a budget's cost from a finished report.

An arm says what it is (recipe, model, which part of the schedule it plays); the budget says how much of it
runs: seeds, labelled images, epochs, the rates swept. Both budgets use the same arms, so a ``quick`` report
is a smaller version of the ``full`` one, never a different experiment.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional, Tuple

from ..errors import ConfigError


def validation_overrides(val_size: Optional[int]) -> Dict[str, Any]:
    """Recipe overrides for the validation split, a seeded, class-stratified hold-out of the training split
    used for every choice (the test split is read once, by the trainer, with the exported weights). None
    keeps the recipe's own split (the Fashion-MNIST recipes hold out 5,000 images, seed 0, the same for
    every training seed and for masked patch prediction). The one place that names the engine's keys."""
    return {} if val_size is None else {"data.val_size": int(val_size)}


def evaluation_overrides(test_images: Optional[int]) -> Dict[str, Any]:
    """Recipe overrides for a budget's test images: None reads the whole test split (once per run); a number
    reads a seeded, class-stratified subset, the same images in every run, so paired contrasts stay paired."""
    return {} if test_images is None else {"data.test_subset": int(test_images)}


@dataclass(frozen=True)
class Budget:
    name: str
    seeds: Tuple[int, ...]
    note: str  # one line for the report: what this budget buys and what it gives up
    train_images: Optional[int]  # labelled images of the main arms (None: the whole split after the hold-out)
    epochs: float  # main arms (training from scratch)
    finetune_epochs: float  # fine-tuning arms (claims 5 and 10)
    data_steps: int  # claim 3: the same optimiser steps at every data size (equal compute)
    data_sizes: Tuple[Optional[int], ...]  # claim 3's nested subsets (None: everything)
    mpp_epochs: float  # claim 8: masked patch prediction over the unlabelled training images
    few_label_epochs: float  # claim 8: the 1,000-label runs (from scratch and after MPP)
    lr_sweep: Tuple[float, ...] = (1e-3, 3e-3)  # rates tried per family on the validation split
    sweep_seeds: Tuple[int, ...] = (0,)  # seeds of the sweep (its runs at the chosen rate are reused)
    few_labels: int = 1000  # claim 8's labelled images (the fmnist-1k recipe's)
    val_size: Optional[int] = None  # validation images held out of the training split (None: the recipe's 5,000)
    test_images: Optional[int] = None  # a fixed stratified subset of the test split (None: all of it)
    curves: bool = True  # validation accuracy after every epoch (learning curves; 5,000 images, forward only)
    fewshot_shots: Tuple[int, ...] = (5, 10)
    fewshot_seeds: Tuple[int, ...] = (0, 1, 2)
    analysis_images: int = 128  # validation images for attention distances (claim 9)
    data_note: str = "Fashion-MNIST (60,000 training and 10,000 test images, 28 px, 10 classes)"
    extra: Dict[str, Any] = field(default_factory=dict)  # overrides applied to every arm (tests: tiny runs)
    version: int = 3  # the rule its report uses: 2 (every p-value in one Holm family) or 3 (the plan's primaries)
    pilot: bool = False  # a pilot: it estimates the primaries' spreads and plans the full budget's seeds
    curve_points: int = 12  # v3: validation evaluations per run, every arm (the convergence rule reads them)
    finetune_lr_sweep: Tuple[float, ...] = ()  # v3: fine-tuning rates swept per fine-tuning arm (empty: the parent's)
    grid_extensions: int = 3  # v3: times a family's grid may grow past an end its best rate sits at
    max_stretch: float = 4.0  # v3: the cap: a family's schedule doubles until it converges, up to this factor
    hours: Optional[float] = None  # wall hours the planner may spend (``jobs`` runs at once), sweep included
    plan_sha: Optional[str] = None  # the analysis plan's SHA-256 every run records (set by the command)

    def with_(self, **kw: Any) -> "Budget":
        return replace(self, **kw)


# the v2 budgets, kept to read (and re-estimate) the committed v2 reports
BUDGETS_V2: Dict[str, Budget] = {
    "quick": Budget(
        name="quick", seeds=(0, 1),
        note="2 seeds per arm, 2,000 labelled images and 3 epochs per main arm, 2,000 validation and 2,000 test "
             "images, rates 1e-3 and 3e-3 swept at seed 0: a smoke test of the set-up; its verdicts are mostly "
             "'underpowered' by design",
        train_images=2000, epochs=3, finetune_epochs=1.5, data_steps=100, data_sizes=(1000, 6000, None),
        mpp_epochs=0.15, few_label_epochs=10, lr_sweep=(1e-3, 3e-3), val_size=2000, test_images=2000,
        curves=False),
    "full": Budget(
        name="full", seeds=(0, 1, 2, 3, 4),
        note="5 seeds per arm; rates 1e-3, 2e-3 and 4e-3 swept per family at seed 0 on validation; 13,000 "
             "labelled images and 12 epochs per main arm, 150 epochs for claim 8's 1,000-label arms, each with "
             "validation curves (they show whether an arm still improves; no arm is stopped early); it does not "
             "buy v1's 55k-image main arms (only claim 3 trains on all 55k), longer schedules, or a sweep at "
             "more than one seed",
        train_images=13000, epochs=12, finetune_epochs=3, data_steps=2400, data_sizes=(1000, 6000, None),
        mpp_epochs=2, few_label_epochs=150, lr_sweep=(1e-3, 2e-3, 4e-3)),
}
BUDGETS_V2 = {k: replace(b, version=2) for k, b in BUDGETS_V2.items()}

BUDGETS: Dict[str, Budget] = {
    "quick": replace(
        BUDGETS_V2["quick"], version=3, pilot=True, seeds=(0, 1, 2), lr_sweep=(2e-3,), curves=True,
        finetune_lr_sweep=(5e-4,), grid_extensions=0, max_stretch=1.0,
        note="the pilot: 3 seeds per arm at one rate (2e-3; fine-tunes 5e-4), 2,000 labelled images and 3 epochs "
             "per main arm, 2,000 validation and 2,000 test images; it prints before training what each primary "
             "hypothesis can show at this budget (its minimum detectable effect) and ends with each primary's "
             "per-seed spread and the seeds the full budget needs; one rate is no interior rate and its schedules "
             "are not grown, so no arm of it can carry a verdict: its verdicts are not the campaign's"),
    "full": replace(
        BUDGETS_V2["full"], version=3, sweep_seeds=(0, 1), hours=22.0, finetune_lr_sweep=(2.5e-4, 5e-4, 1e-3),
        note="5 to 20 seeds per arm as the pre-training power analysis plans them (80% power for each primary "
             "hypothesis's effect of interest under Holm, within 22 hours of wall time at --jobs 2), rates 1e-3, "
             "2e-3 and 4e-3 (fine-tunes 2.5e-4, 5e-4 and 1e-3) swept per family at seeds 0 and 1 on validation, "
             "a grid grown past an end its best rate sits at, 13,000 labelled images and 12 epochs per main arm, "
             "150 epochs for claim 8's 1,000-label arms, each schedule doubled (up to 4 times) until the chosen "
             "point's validation curve has converged, 12 validation evaluations per arm"),
}


def get_budget(name: str, version: int = 3) -> Budget:
    """A budget by name: the current (v3) ones, or with ``version=2`` those the v2 reports ran."""
    table = BUDGETS_V2 if version == 2 else BUDGETS
    if name not in table:
        raise ConfigError(f"unknown budget {name!r}: use one of {', '.join(table)}")
    return table[name]
