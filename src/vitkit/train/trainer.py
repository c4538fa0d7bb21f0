"""The training loop: a recipe and a run folder in, a trained, evaluated, exported ViT out.

Run folder (``out``)::

    recipe.yaml          the resolved recipe (after inheritance and overrides)
    metrics.jsonl        train lines every log_every steps, eval lines (validation split) at every
                         evaluation, one test line at the end
    metrics.csv, tensorboard/   the same lines as a table / TensorBoard scalars, if train.log asks
    checkpoints/last.pt  model, optimiser, EMA, step/epoch/position, RNG states (atomic, resumable)
    model/               the exported model in vitkit's format (labels + preprocessing included)
    results.json         validation scores of the raw and EMA weights, which were exported and why,
                         the exported weights' test accuracy, time, throughput
    curves.png           loss / accuracy / lr; predictions.png: a few test images with predictions

The protocol: periodic evaluations and the choice of the exported weights use the validation split held
out of the training data (``data.val_size`` / ``data.val_fraction``, seeded by ``data.val_seed``); the test
split is read once, at the end, by the exported weights (:mod:`vitkit.train.selection`,
:mod:`vitkit.train.report`).

Read top to bottom: :func:`train` makes a :class:`Trainer`, which resolves the recipe (a copy: the caller's
is never written), builds the run's set-up and its initial state once (:func:`vitkit.train.rundata.build_run`:
data, model, optimiser, schedule; the :class:`~vitkit.train.checkpoint.RunState` that is saved and restored
whole), asks the objective for its optimiser step, and :meth:`Trainer.fit` runs the loop. The objective
(:class:`~vitkit.train.report.Classification`, :class:`~vitkit.train.distill.Distillation`,
:class:`~vitkit.train.mpp.MaskedPatchObjective`) owns its loss, its wrapping of the model, its evaluation
and its report; the loop calls it and never asks which one it is.

Time budget (``schedule.minutes``): the schedule then advances by whichever is further along, the step
count or the training time (evaluations and checkpoints excluded) over the budget, and the run ends when
either is spent. Such a run is driven by the clock, so it is not bit-reproducible.

Exact resume: the epoch order is a function of (seed, epoch); the augmentation and dropout noise of
step ``s`` come from generators seeded by (seed, s, rank); the lr is a function of the step. So a run
killed at any point and resumed from its last checkpoint ends with the same weights (on CPU, and on
GPU with ``train.deterministic``).
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ..data.datasets import Dataset
from ..errors import ConfigError, NotFoundError, TrainingDiverged, VitkitWarning
from ..models.kernel_plan import Backend, use_backend
from ..models.kernel_plan import current as current_backend
from ..models.kernel_plan import source as backend_source
from ..utils import PathLike, remove_stale_temps
from . import distributed as D
from .checkpoint import find_last
from .distill import Distillation
from .loggers import check_loggers
from .recipe import Recipe
from .report import Classification
from .rundata import build_run
from .runlog import MetricsLog
from .sections import TrainConfig


def _seed_for(seed: int, step: int, rank: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + step * 4099 + rank * 131 + salt) % (2 ** 63 - 1)


def run_backend(t: TrainConfig) -> Backend:
    """The kernels the run computes with: the recipe's ``train.backend`` or the one in force (pinned under
    ``train.deterministic``); warns when the recipe's pin replaces a fixed choice in force."""
    in_force = current_backend()
    backend = Backend.parse(t.backend if t.backend is not None else in_force.spec)
    overridden = [k for k, v in in_force.__dict__.items() if v != "auto" and v != getattr(backend, k)]
    if t.backend is not None and overridden:  # a fixed choice in force that the recipe's pin replaces
        warnings.warn(f"the recipe pins train.backend={backend.spec}, so the backend in force "
                      f"({in_force.spec}, from {backend_source()}) is not used by this run; "
                      "pass --backend (or train.backend) to change it", VitkitWarning, stacklevel=3)
    return backend.pinned() if t.deterministic else backend


def objective_for(recipe: Recipe) -> Classification:
    """The objective a classification recipe trains with: distillation when it names a teacher."""
    return Distillation(recipe.distill) if recipe.distill.teacher else Classification()


class Trainer:
    """A run: its set-up (``run``), its state (``state``), the objective's step and the metrics log;
    :meth:`fit` trains. ``objective``: None for classification (or distillation when the recipe names a
    teacher), or an objective object (``vitkit.train.mpp.MaskedPatchObjective``)."""

    clock = staticmethod(time.perf_counter)  # the training-time clock (the budget's); tests replace it

    def __init__(self, recipe: Recipe, out: PathLike, *, resume: bool = False, progress: bool = True,
                 stop_after: Optional[int] = None, data: Optional[Dict[str, Dataset]] = None,
                 objective: Any = None):
        objective = objective if objective is not None else objective_for(recipe)
        recipe = objective.resolve(recipe)  # a copy where the objective fills fields in; the caller's is untouched
        self.progress, self.stop_after = progress, stop_after  # stop_after: stop as if killed (tests)
        t, out = recipe.train, Path(out)
        check_loggers(t.log)  # an optional logger's package, before the data or the run folder
        if t.threads:
            torch.set_num_threads(int(t.threads))
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        backend = run_backend(t)  # the kernels this run declares (planned for its model in build_run)
        # recipe.yaml records what the run computes with (resume reuses it)
        recipe = dataclasses.replace(recipe, train=dataclasses.replace(t, backend=backend.spec))
        dist = D.setup(t.device)
        if t.precision == "fp16" and dist.device.type != "cuda":
            raise ConfigError(f"train.precision=fp16 trains with a CUDA gradient scaler; this run is on "
                              f"{dist.device}", key="train.precision", hint="use bf16 (or fp32) on a CPU")
        last = find_last(out)  # the run folder's state is checked first: it needs no data
        if resume and last is None:
            raise NotFoundError("no checkpoint to resume (--resume)", path=out / "checkpoints",
                                hint="start the run without --resume")
        self.log: Optional[MetricsLog] = None
        self.run, self.state = build_run(recipe, out, backend, dist, objective, data)
        self.step_fn = objective.make_step(self.run, self.state)
        if t.eval_every > 0 and self.run.data.val is None and dist.main:
            print(f"note: recipe {recipe.name!r} has no validation split (data.val_size / data.val_fraction), so it "
                  f"evaluates only at the end: the test split is never used during training")
        if dist.main:
            out.mkdir(parents=True, exist_ok=True)
        if resume:
            self.state.restore(last)
            if dist.main:
                remove_stale_temps(out)  # temp files of writes a kill interrupted
        elif last is not None:
            raise ConfigError(f"{out} already holds a run (checkpoints/last.pt): pass --resume to continue it, "
                              f"or choose another --out")
        if dist.main:
            recipe.save(out / "recipe.yaml")
        if not resume and dist.main and (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").unlink()
        self.log = MetricsLog(out / "metrics.jsonl", dist.main, truncate_after_step=self.state.step if resume else None,
                              resume_rows=self.state.metrics_rows, loggers=t.log,
                              config=recipe.to_dict() if t.log else None)

    def save_checkpoint(self) -> Optional[Path]:
        """Save the run state as checkpoints/last.pt; its path on the main process (None on the others)."""
        run = self.run
        return self.state.save(run.out, run.dist, self.log.rows if self.log is not None else None,
                               recipe=run.recipe.to_dict(), classes=run.data.classes, config=run.config.to_dict())

    # --- the loop -----------------------------------------------------------------------------
    def fit(self) -> Dict[str, Any]:
        """Train to the end (or the time budget), then evaluate and export; under the run's backend."""
        with use_backend(self.run.backend):
            try:
                return self._fit()
            finally:
                if self.log is not None:
                    self.log.close()

    def _fit(self) -> Dict[str, Any]:
        run, state = self.run, self.state
        r, d = run.recipe, run.dist
        t0 = self._t0 = time.perf_counter()
        bar = self._progress_bar()
        acc_sum = torch.zeros(3, dtype=torch.float64)  # loss, acc, count since the last log line
        seen = 0
        last_good = state.step
        mark = state.trained_s  # training time at the last metrics line
        stopped = False
        while not run.done(state):
            epoch, start = state.position
            clock = self.clock()
            for images, labels in run.loader.epoch(epoch, start):
                lr, stats, n, clock = self._train_step(images, labels, clock, last_good)
                seen += n * d.world
                acc_sum += torch.tensor([float(stats["loss"]), float(stats["acc"]), 1.0], dtype=torch.float64)
                if state.step % r.train.log_every == 0 or run.done(state):
                    self._log_train_line(acc_sum, seen, state.trained_s - mark, lr, stats, bar)
                    acc_sum.zero_()
                    seen, mark = 0, state.trained_s
                if bar is not None:
                    bar.update(1)
                if run.eval_interval and (state.step % run.eval_interval == 0) and not run.done(state):
                    self.log.write(run.objective.validate(run, state, time=round(time.perf_counter() - t0, 2),
                                                          train_time=round(state.trained_s, 2)))
                    clock = self.clock()
                if r.train.ckpt_every and state.step % r.train.ckpt_every == 0 and not run.done(state):
                    self.save_checkpoint()
                    last_good = state.step
                    clock = self.clock()
                if self.stop_after is not None and state.step >= self.stop_after:
                    stopped = True
                    break
                if run.done(state):
                    break
            if stopped:
                break
            if state.step % run.steps_per_epoch == 0 and not r.train.ckpt_every and not run.done(state):
                self.save_checkpoint()
                last_good = state.step
        if bar is not None:
            bar.close()
        if stopped:
            return {"stopped_at": state.step}
        self.save_checkpoint()
        return run.objective.finish(run, state, self.log, time.perf_counter() - t0)

    def _progress_bar(self) -> Any:
        """A tqdm bar over the run's steps on the main process when ``progress`` is on, else None."""
        if not (self.progress and self.run.dist.main):
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.run.total_steps, initial=self.state.step, desc=self.run.recipe.name, unit="step",
                    dynamic_ncols=True, mininterval=1.0)

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor, clock: float, last_good: int
                    ) -> Tuple[float, Dict[str, torch.Tensor], int, float]:
        """One optimiser step on a loaded batch: the schedule's lr and patch-dropout rate, augmentation and
        noise seeded by (seed, step, rank), the training clock advanced from ``clock``, divergence checked
        (on every process), the step handed to the run state. Returns (lr, step stats, images, clock)."""
        run, state = self.run, self.state
        seed, d, step = run.recipe.train.seed, run.dist, state.step
        where = run.progress_step(state)
        lr = run.schedule(where)
        # the schedule's lr, and the dropout / stochastic-depth noise of this step, set by the run state
        state.begin_step(lr, _seed_for(seed, step, d.rank, salt=1))
        # the schedule's patch-dropout rate goes to the forward call (no state written into the model)
        forward_kw = {"patch_drop": run.patch_drop_at(where)} if run.config.patch_drop else {}
        g = torch.Generator().manual_seed(_seed_for(seed, step, d.rank))  # the augmentation's own generator
        x, y = run.augment(images, labels, g)
        x, y = x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True)
        stats = self.step_fn(x, y, **forward_kw)
        bad = not bool(torch.isfinite(stats["grad_norm"])) or not bool(torch.isfinite(stats["loss"]))
        now = self.clock()
        trained_s = state.trained_s + (now - clock)
        if d.enabled:  # one collective: divergence anywhere, and the slowest process's clock
            agreed = D.all_reduce_max(torch.tensor([float(bad), trained_s], dtype=torch.float64), d)
            bad, trained_s = bool(agreed[0] > 0), float(agreed[1])
        if not bad:
            state.end_step(trained_s, run.model)
            return lr, stats, x.shape[0], now
        raise self._diverged(step, lr, stats, last_good)

    def _log_train_line(self, acc_sum: torch.Tensor, seen: int, elapsed: float, lr: float,
                        stats: Dict[str, torch.Tensor], bar: Any) -> None:
        """One ``kind: train`` line of metrics.jsonl: loss and accuracy averaged since the last line (over
        all processes), throughput over ``elapsed`` training seconds (evaluations and checkpoints excluded)."""
        d, step = self.run.dist, self.state.step
        m = D.all_reduce_mean(acc_sum.to(d.device), d).cpu() if d.enabled else acc_sum
        rec = {"kind": "train", "step": step, "epoch": round(step / self.run.steps_per_epoch, 4),
               "loss": float(m[0] / m[2]), "acc": float(m[1] / m[2]), "lr": lr,
               "grad_norm": float(stats["grad_norm"]), "img_per_s": seen / max(elapsed, 1e-9),
               "time": round(time.perf_counter() - self._t0, 2)}
        self.log.write(rec)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{100 * rec['acc']:.1f}%", lr=f"{lr:.2e}",
                            img_s=f"{rec['img_per_s']:.0f}", refresh=False)

    def _diverged(self, step: int, lr: float, stats: Dict[str, torch.Tensor], last_good: int
                  ) -> TrainingDiverged:
        """The error of a step whose loss or gradient norm is not finite (after writing its ``diverged`` line),
        naming the last good checkpoint to resume from; the caller raises it."""
        where = self.run.out / "checkpoints" / "last.pt"
        has = where.is_file()
        msg = (f"training diverged at step {step + 1}: loss {float(stats['loss']):.4g}, gradient norm "
               f"{float(stats['grad_norm']):.4g} (lr {lr:.3g}). ")
        msg += (f"The last good checkpoint (step {last_good}) is kept at {where}: resume from it with --resume "
                f"and a lower learning rate (--set optim.lr=...), stronger clipping or fp32."
                if has else "No checkpoint was written yet: lower the learning rate or use fp32 and start again.")
        if self.log is not None:
            self.log.write({"kind": "diverged", "step": step + 1, "loss": float(stats["loss"]), "lr": lr})
        return TrainingDiverged(msg)


def train(recipe: Recipe, out: PathLike, *, resume: bool = False, progress: bool = True, objective: Any = None
          ) -> Dict[str, Any]:
    """Train ``recipe`` into the run folder ``out`` (resuming it with ``resume``) with ``objective`` (None:
    classification, or distillation when the recipe names a teacher); returns results.json's dict."""
    trainer = Trainer(recipe, out, resume=resume, progress=progress, objective=objective)
    try:
        return trainer.fit()
    finally:
        del trainer  # collected by teardown, before the process group goes
        D.teardown()
