"""A training run's set-up, built once from its recipe (:func:`build_run`), and the state it starts from.

The set-up (:class:`RunSetup`) is what a run computes with and never changes: its data (the training and
test splits opened, or the datasets a caller gives, wrapped; the validation split held out of the training
split, :func:`.selection.hold_out`; the optional training subset), the model wrapped by the objective, the
augmentation, the evaluation, the sampler, the schedule and the backend. What changes as the run trains
(weights, optimiser, EMA, loss scale, step, time) is the :class:`~vitkit.train.checkpoint.RunState`
built beside it. The recipe is read, never written.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from ..config import ViTConfig
from ..data.augment import BatchAugment, EvalTransform, Normalize
from ..data.datasets import Dataset, auto_eval_split, open_dataset
from ..data.loader import EpochSampler, Loader
from ..errors import ConfigError
from ..models import VisionTransformer
from ..models.kernel_plan import Backend, bind
from ..models.planner import plan as plan_kernels
from . import distributed as D
from .checkpoint import RunState, grad_scaler
from .evaluate import eval_preprocessing, transform_for
from .optim import EMA, Schedule, build_optimizer
from .recipe import Recipe
from .selection import Evaluator, run_splits
from .weights import start_model


@dataclass(frozen=True)
class RunData:
    """The splits of one run and the size file datasets decode to."""

    classes: List[str]
    train: Dataset  # the training split less the validation hold-out (and cut to data.train_subset)
    val: Optional[Dataset]  # the validation hold-out (None: the recipe holds none out)
    test: Optional[Dataset]  # read once, at the end
    load_size: int  # the square file datasets decode to
    eval_split: Optional[str] = None  # the split ``test`` is (data.eval_split, ``auto`` resolved)


def open_run_data(recipe: Recipe, given: Optional[Dict[str, Dataset]] = None) -> RunData:
    """The splits ``recipe`` trains, selects and tests on; ``given`` ({"train": ..., "test": ...}): vitkit's
    datasets, or any torch / Hugging Face dataset (wrapped by :mod:`vitkit.data.external`), instead of
    ``data.dataset``."""
    r = recipe
    dc = r.data
    size_hint = r.model.get("img_size") or 224
    size_hint = size_hint if isinstance(size_hint, int) else max(size_hint)
    load_size = dc.load_size or int(round(size_hint / 0.875))
    chans = r.model.get("in_chans", "auto")
    chans = 3 if chans == "auto" else int(chans)
    if not given and not dc.dataset:
        raise ConfigError(f"recipe {r.name!r} names no dataset: pass --data (e.g. --data folder:/data/pets, whose "
                         f"sub-folders are the classes, or shards:/data/train-{{000..015}}.tar)")
    if given:
        from ..data.external import from_dataset
        wrap = lambda ds, cls=None: ds if ds is None or hasattr(ds, "gather") else from_dataset(  # noqa: E731
            ds, classes=cls, load_size=load_size, channels=chans)
        train_full = wrap(given["train"])
        test = wrap(given.get("test"), train_full.classes)
        split = "test" if test is not None else None
    else:
        train_full = open_dataset(dc.dataset, dc.train_split, root=dc.root, load_size=load_size, channels=chans)
        split = auto_eval_split(dc.dataset, dc.root) if dc.eval_split == "auto" else dc.eval_split
        test = open_dataset(dc.dataset, split, root=dc.root, load_size=load_size, channels=chans,
                            classes=train_full.classes) if split else None
    if dc.cache and not train_full.in_memory:
        train_full = train_full.to_memory()
        test = test.to_memory() if test is not None and not test.in_memory else test
    train, val, test = run_splits(train_full, test, dc, r.train.seed + 1)
    return RunData(list(train_full.classes), train, val, test, load_size, split)


@dataclass(frozen=True)
class RunSetup:
    """What a run computes with, built once from the (resolved) recipe by :func:`build_run`."""

    recipe: Recipe  # the resolved recipe (backend and objective fields filled in): what recipe.yaml records
    out: Path
    backend: Backend
    dist: D.Dist
    data: RunData
    objective: Any  # the objective (report.Classification, distill.Distillation, mpp.MaskedPatchObjective)
    vit: VisionTransformer  # the ViT being trained
    model: nn.Module  # the plain module the objective trains (the ViT, or the ViT wrapped by the objective)
    wrapped: nn.Module  # model under DDP / FSDP (itself on one process)
    forward_model: nn.Module  # wrapped, compiled when train.compile
    ema_model: Optional[nn.Module]  # a plain copy that receives the EMA weights to evaluate / export them
    init_notes: List[str]  # what loading init.checkpoint adapted (position-embedding resize, new head ...)
    normalize: Normalize
    augment: BatchAugment
    eval_tf: EvalTransform
    evaluator: Evaluator
    loader: Loader
    steps_per_epoch: int
    schedule: Schedule

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def config(self) -> ViTConfig:
        return self.vit.config

    @property
    def total_steps(self) -> int:
        return self.schedule.total

    @property
    def budget_s(self) -> Optional[float]:
        """The training-time budget in seconds (``schedule.minutes``), or None."""
        m = self.recipe.schedule.minutes
        return 60.0 * m if m else None

    @property
    def eval_interval(self) -> int:
        """Steps between validation evaluations (0: only at the end; always 0 without a validation split)."""
        ev = self.recipe.train.eval_every
        if ev <= 0 or self.data.val is None:
            return 0
        return max(1, int(round(ev * self.steps_per_epoch)))

    def progress_step(self, state: RunState) -> int:
        """Where the schedule stands: the step count, or further along when the time budget runs ahead."""
        if self.budget_s is None:
            return state.step
        return max(state.step, int(state.trained_s / self.budget_s * self.total_steps))

    def done(self, state: RunState) -> bool:
        """Whether the run has reached its last step or used up its time budget."""
        return state.step >= self.total_steps or (self.budget_s is not None and state.trained_s >= self.budget_s)

    def patch_drop_at(self, step: int) -> float:
        """The patch-dropout rate of schedule step ``step`` (constant without ``schedule.patch_drop_end``)."""
        s, start = self.recipe.schedule, float(self.config.patch_drop)
        if s.patch_drop_end is None:
            return start
        frac = min(step / self.total_steps, 1.0)
        if frac <= s.patch_drop_from:
            return start
        return start + (s.patch_drop_end - start) * (frac - s.patch_drop_from) / (1.0 - s.patch_drop_from)

    def preprocessing(self) -> Dict[str, Any]:
        """The evaluation preprocessing of the trained model (the recipe's normalisation at its size)."""
        return eval_preprocessing(self.recipe.data, self.config, self.data.train.in_memory, self.data.load_size)

    def weights(self, state: RunState, periodic: bool = False) -> Iterator[Tuple[str, nn.Module]]:
        """(kind, module) of the weights a run may export: ``raw`` (the trained module) and, with EMA on,
        ``ema`` (the plain copy, given the averaged weights now; collective under FSDP). ``periodic``: those a
        periodic evaluation scores (the raw weights only under ``train.eval_ema: false``)."""
        yield "raw", self.forward_model
        if state.ema is not None and (not periodic or self.recipe.train.eval_ema):
            self.ema_model.load_state_dict({k: D.full_tensor(v) for k, v in state.ema.shadow.items()})
            yield "ema", self.ema_model

    def export_module(self, state: RunState, kind: str) -> Optional[nn.Module]:
        """The ``kind`` weights (raw / ema) as the plain module to publish (the objective's export of it).
        Collective under FSDP: every rank calls it (None on the other ranks)."""
        if kind == "ema":
            return self.objective.export(dict(self.weights(state))["ema"])
        if self.recipe.train.distributed == "fsdp" and self.dist.enabled:
            full = D.full_state(self.wrapped)[0]  # gathered on rank 0 only
            if not self.dist.main:
                return None
            plain = self.objective.wrap(VisionTransformer(self.config), self.recipe)
            plain.load_state_dict(full)
            return self.objective.export(plain)
        return self.objective.export(self.model)


def build_run(recipe: Recipe, out: Path, backend: Backend, dist: D.Dist, objective: Any,
              given: Optional[Dict[str, Dataset]] = None) -> Tuple[RunSetup, RunState]:
    """The set-up and the initial state of a run of the resolved ``recipe`` (seeded by ``train.seed``), built
    in one pass: data, sampler, model (wrapped by the objective, distributed, kernels planned), evaluation,
    augmentation, optimiser, EMA, schedule."""
    r, t = recipe, recipe.train
    torch.manual_seed(t.seed)
    data = open_run_data(r, given)
    sampler = EpochSampler(len(data.train), r.optim.batch_size, shuffle=True, seed=t.seed, rank=dist.rank,
                           world=dist.world, repeats=r.augment.repeats)
    loader = Loader(data.train, sampler, r.data.workers)
    vit, notes = start_model(r, len(data.classes), data.train.channels)
    config = vit.config
    if r.schedule.patch_drop_end and not config.patch_drop:  # (an end of 0 without patch dropout: nothing to do)
        raise ConfigError(f"schedule.patch_drop_end={r.schedule.patch_drop_end} schedules patch dropout, but the "
                          f"model has none: set model.patch_drop to the starting rate (e.g. --set "
                          f"model.patch_drop=0.5)")
    if t.grad_checkpointing:
        vit.set_grad_checkpointing(True)
    model = objective.wrap(vit, r).to(dist.device)
    # the kernels of the run, planned once for its device, precision and shapes (timing what no measurement
    # covers yet) and bound to the ViT and any module the objective wraps it with
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
    plan = vit.set_kernel_plan(plan_kernels(config, (torch.float32,) + ((low,) if low else ()), dist.device,
                                            backend=backend))
    bind(model, plan)
    wrapped = D.wrap(model, dist, t.distributed)
    preprocessing = eval_preprocessing(r.data, config, data.train.in_memory, data.load_size)
    eval_tf = transform_for(preprocessing, config, data.train)  # as `vitkit eval` reads it
    norm = Normalize(r.data.mean, r.data.std, channels=config.in_chans)
    augment = BatchAugment(r.augment, config.img_size, len(data.classes), norm)
    optimizer = build_optimizer(wrapped, r.optim, dist.device)
    schedule = Schedule.from_config(r.schedule, r.optim.lr, len(sampler))
    ema = EMA(model, t.ema, t.ema_warmup) if t.ema > 0 else None
    ema_model = None
    if ema is not None:  # a plain copy that receives the averaged weights, computing with the same plan
        ema_vit = VisionTransformer(config)
        ema_model = objective.wrap(ema_vit, r).to(dist.device)
        bind(ema_model, ema_vit.set_kernel_plan(plan))
    run = RunSetup(recipe=r, out=out, backend=backend, dist=dist, data=data, objective=objective, vit=vit, model=model,
                   wrapped=wrapped, forward_model=torch.compile(wrapped) if t.compile else wrapped,
                   ema_model=ema_model, init_notes=notes, normalize=norm, augment=augment, eval_tf=eval_tf,
                   evaluator=Evaluator(eval_tf, dist.device, dist, t.precision, r.data.eval_batch_size,
                                       r.data.workers),
                   loader=loader, steps_per_epoch=len(sampler), schedule=schedule)
    state = RunState(wrapped, optimizer, ema=ema, scaler=grad_scaler(t.precision),
                     steps_per_epoch=run.steps_per_epoch, total_steps=run.total_steps)
    return run, state
