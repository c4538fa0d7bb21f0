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
:mod:`vitkit.train.report`). This module holds the set-up and the loop; the run's data come from
:mod:`vitkit.train.rundata`, the state a checkpoint holds from :mod:`vitkit.train.checkpoint`.

Time budget (``schedule.minutes``): the schedule then advances by whichever is further along, the step
count or the training time (evaluations and checkpoints excluded) over the budget, and the run ends when
either is spent. Such a run is driven by the clock, so it is not bit-reproducible.

Exact resume: the epoch order is a function of (seed, epoch); the augmentation and dropout noise of
step ``s`` come from generators seeded by (seed, s, rank); the lr is a function of the step. So a run
killed at any point and resumed from its last checkpoint ends with the same weights (on CPU, and on
GPU with ``train.deterministic``).
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ..data.augment import BatchAugment, Normalize
from ..data.datasets import Dataset
from ..data.loader import EpochSampler, Loader
from ..errors import ConfigError, TrainingDiverged, VitkitWarning
from ..models import VisionTransformer
from ..models.kernel_plan import Backend, bind, use_backend
from ..models.kernel_plan import current as current_backend
from ..models.kernel_plan import source as backend_source
from ..models.planner import plan as plan_kernels
from ..utils import PathLike, remove_stale_temps
from . import distributed as D
from .checkpoint import find_last, load_state, restore_trainer, save_state, trainer_state
from .distill import Distillation
from .evaluate import transform_for
from .loggers import check_loggers
from .optim import EMA, Schedule, build_optimizer, set_lr, unwrap
from .recipe import Recipe
from .report import finish_classification
from .rundata import eval_preprocessing, open_run_data
from .runlog import MetricsLog
from .selection import Evaluator, eval_record
from .step import TrainStep


def _seed_for(seed: int, step: int, rank: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + step * 4099 + rank * 131 + salt) % (2 ** 63 - 1)


class Trainer:
    """Builds data, model, optimiser and schedule from a recipe; :meth:`fit` trains."""

    def __init__(self, recipe: Recipe, out: PathLike, *, resume: bool = False, progress: bool = True,
                 stop_after: Optional[int] = None, data: Optional[Dict[str, Dataset]] = None):
        self.recipe, self.out, self.progress = recipe, Path(out), progress
        self.stop_after = stop_after  # stop (as if killed) after this many steps: for tests
        t = recipe.train
        check_loggers(t.log)  # an optional logger's package, before the data or the run folder
        if t.threads:
            torch.set_num_threads(int(t.threads))
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        in_force = current_backend()
        self.backend = Backend.parse(t.backend if t.backend is not None else in_force.spec)
        overridden = [k for k, v in in_force.__dict__.items() if v != "auto" and v != getattr(self.backend, k)]
        if t.backend is not None and overridden:  # a fixed choice in force that the recipe's pin replaces
            warnings.warn(f"the recipe pins train.backend={self.backend.spec}, so the backend in force "
                          f"({in_force.spec}, from {backend_source()}) is not used by this run; "
                          "pass --backend (or train.backend) to change it", VitkitWarning, stacklevel=2)
        if t.deterministic:
            self.backend = self.backend.pinned()
        t.backend = self.backend.spec  # recipe.yaml records what the run computes with (resume reuses it)
        self.dist = D.setup(t.device)
        self.device = self.dist.device
        if t.precision == "fp16" and self.device.type != "cuda":
            raise ConfigError(f"train.precision=fp16 trains with a CUDA gradient scaler; this run is on {self.device}",
                              key="train.precision", hint="use bf16 (or fp32) on a CPU")
        torch.manual_seed(t.seed)
        last = find_last(self.out)  # the run folder's state is checked first: it needs no data
        if resume and last is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.out / 'checkpoints'}; start the run "
                                    f"without --resume")
        self._build_data(data)
        self._build_model()
        self._build_optim()
        self.step = 0
        self.trained_s = 0.0  # training time so far (evaluations and checkpoints excluded), kept on resume
        self.log = None
        self.resume_rows = None  # metrics.jsonl lines the resumed checkpoint had seen
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            restore_trainer(self, load_state(last))
            if self.dist.main:
                remove_stale_temps(self.out)  # temp files of writes a kill interrupted
        elif last is not None:
            raise ConfigError(f"{self.out} already holds a run (checkpoints/last.pt): pass --resume to continue "
                              f"it, or choose another --out")
        if self.dist.main:
            recipe.save(self.out / "recipe.yaml")
        self.log = MetricsLog(self.out / "metrics.jsonl", self.dist.main,
                              truncate_after_step=self.step if resume else None, resume_rows=self.resume_rows,
                              loggers=recipe.train.log, config=recipe.to_dict() if recipe.train.log else None)
        if not resume and self.dist.main and (self.out / "metrics.jsonl").exists():
            (self.out / "metrics.jsonl").unlink()

    # --- set-up -----------------------------------------------------------------------------
    def _build_data(self, given: Optional[Dict[str, Dataset]]) -> None:
        data = open_run_data(self.recipe, given)
        self.classes, self.load_size = data.classes, data.load_size
        self.train_data, self.val_data, self.test_data = data.train, data.val, data.test
        self.eval_split = data.eval_split

    def _build_model(self) -> None:
        r, t = self.recipe, self.recipe.train
        n_cls, chans = len(self.classes), self.train_data.channels
        self.init_notes = []
        if r.init.checkpoint:
            def target(base):
                fields_in_chans = r.model.get("in_chans", "auto")
                return r.model_config(num_classes=n_cls, in_chans=None if fields_in_chans == "auto" else chans,
                                      base=base)
            from .weights import load_init

            model, self.init_notes = load_init(r.init.checkpoint, target, head=r.init.head,
                                               num_heads=r.init.num_heads)
        else:
            model = VisionTransformer(r.model_config(num_classes=n_cls, in_chans=chans))
        self.config = model.config
        if t.grad_checkpointing:
            model.set_grad_checkpointing(True)
        model = self.wrap_model(model)
        model.to(self.device)
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
        # the kernels, planned once for this run's device, precision and shapes (timing what is not known yet)
        vit = next(m for m in model.modules() if isinstance(m, VisionTransformer))  # an objective may wrap it
        bind(model, vit.set_kernel_plan(plan_kernels(vit.config, (torch.float32,) + ((low,) if low else ()),
                                                     self.device, backend=self.backend)))
        self.model = model  # the plain module (weights, export, EMA)
        self.wrapped = D.wrap(model, self.dist, t.distributed)
        self.forward_model = torch.compile(self.wrapped) if t.compile else self.wrapped
        dc = r.data
        norm = Normalize(dc.mean, dc.std, channels=self.config.in_chans)
        self.normalize = norm
        self.augment = BatchAugment(r.augment, self.config.img_size, len(self.classes), norm)
        self.eval_tf = transform_for(self.preprocessing(), self.config, self.train_data)  # as `vitkit eval` reads it
        self.evaluator = Evaluator(self.eval_tf, self.device, self.dist, r.train.precision, dc.eval_batch_size,
                                   dc.workers)

    clock = staticmethod(time.perf_counter)  # the training-time clock (the budget's); tests replace it

    step_class = TrainStep  # the optimiser step; objectives other than classification subclass it

    def wrap_model(self, model: VisionTransformer) -> torch.nn.Module:
        """The module trained around the ViT: the ViT itself here; other objectives wrap it (masked patch
        prediction adds a mask embedding and a prediction head: ``vitkit.train.mpp``)."""
        return model

    def _build_optim(self) -> None:
        r, d = self.recipe, self.dist
        o = r.optim
        self.optimizer = build_optimizer(self.wrapped, o, self.device)
        self.sampler = EpochSampler(len(self.train_data), o.batch_size, shuffle=True, seed=r.train.seed,
                                    rank=d.rank, world=d.world, repeats=r.augment.repeats)
        self.loader = Loader(self.train_data, self.sampler, r.data.workers)
        self.steps_per_epoch = len(self.sampler)
        self.schedule = Schedule.from_config(r.schedule, o.lr, self.steps_per_epoch)
        self.total_steps = self.schedule.total
        s = r.schedule
        self.budget_s = 60.0 * s.minutes if s.minutes else None
        self.vit = next(m for m in unwrap(self.model).modules() if isinstance(m, VisionTransformer))
        self.patch_drop_start = float(self.vit.config.patch_drop)
        if s.patch_drop_end and not self.patch_drop_start:  # (an end of 0 without patch dropout: nothing to do)
            raise ConfigError(f"schedule.patch_drop_end={s.patch_drop_end} schedules patch dropout, but the model has "
                              f"none: set model.patch_drop to the starting rate (e.g. --set model.patch_drop=0.5)")
        self.ema = EMA(self.model, r.train.ema, r.train.ema_warmup) if r.train.ema > 0 else None
        step_kw = dict(precision=r.train.precision, clip_grad=o.clip_grad, accum_steps=o.accum_steps,
                       label_smoothing=r.augment.label_smoothing, device=self.device)
        self.distillation = self._distillation()
        if self.distillation is not None:
            self.step_fn = self.distillation.step(self.forward_model, self.optimizer, self.normalize,
                                                  self.config.img_size, **step_kw)
        else:
            self.step_fn = self.step_class(self.forward_model, self.optimizer, **step_kw)
        ev = r.train.eval_every
        self.eval_interval = max(1, int(round(ev * self.steps_per_epoch))) if ev > 0 else 0
        if self.eval_interval and self.val_data is None and d.main:
            print(f"note: recipe {r.name!r} has no validation split (data.val_size / data.val_fraction), so it "
                  f"evaluates only at the end: the test split is never used during training")
            self.eval_interval = 0

    def _distillation(self) -> Optional[Distillation]:
        """The teacher strategy when the recipe names a teacher (section ``distill``), else None."""
        dd = self.recipe.distill
        if not dd.teacher:
            return None
        if self.step_class is not TrainStep:
            raise ConfigError(f"distill.teacher is for classification training, not for {type(self).__name__}")
        return Distillation(dd.teacher, self.classes, self.device, kind=dd.kind, alpha=dd.alpha, tau=dd.tau,
                            num_heads=dd.num_heads)

    # --- checkpoints ------------------------------------------------------------------------
    def save_checkpoint(self) -> Optional[Path]:
        """Save the run's state (weights, optimiser, EMA, step, RNGs) as checkpoints/last.pt; returns its path
        on the main process (None on the others)."""
        st = trainer_state(self)  # collective under FSDP: every rank takes part
        path = None
        if self.dist.main:
            path = save_state(self.out / "checkpoints" / "last.pt", st)
        D.barrier(self.dist)
        return path

    # --- the loop -----------------------------------------------------------------------------
    def progress_step(self) -> int:
        """Where the schedule stands: the step count, or further along when the time budget runs ahead."""
        if self.budget_s is None:
            return self.step
        return max(self.step, int(self.trained_s / self.budget_s * self.total_steps))

    def done(self) -> bool:
        """Whether the run has reached its last step or used up its time budget."""
        return self.step >= self.total_steps or (self.budget_s is not None and self.trained_s >= self.budget_s)

    def patch_drop_at(self, step: int) -> float:
        """The patch-dropout rate of schedule step ``step`` (constant without ``schedule.patch_drop_end``)."""
        s, start = self.recipe.schedule, self.patch_drop_start
        if s.patch_drop_end is None:
            return start
        frac = min(step / self.total_steps, 1.0)
        if frac <= s.patch_drop_from:
            return start
        return start + (s.patch_drop_end - start) * (frac - s.patch_drop_from) / (1.0 - s.patch_drop_from)

    def fit(self) -> Dict[str, Any]:
        """Train to the end (or the time budget), then evaluate and export; under the run's backend."""
        with use_backend(self.backend):
            try:
                return self._fit()
            finally:
                if self.log is not None:
                    self.log.close()

    def _fit(self) -> Dict[str, Any]:
        r, d = self.recipe, self.dist
        t0 = self._t0 = time.perf_counter()
        bar = self._progress_bar()
        acc_sum = torch.zeros(3, dtype=torch.float64)  # loss, acc, count since the last log line
        seen = 0
        last_good = self.step
        mark = self.trained_s  # training time at the last metrics line
        stopped = False
        while not self.done():
            epoch, start = divmod(self.step, self.steps_per_epoch)
            clock = self.clock()
            for images, labels in self.loader.epoch(epoch, start):
                lr, stats, n, clock = self._train_step(images, labels, clock, last_good)
                seen += n * d.world
                acc_sum += torch.tensor([float(stats["loss"]), float(stats["acc"]), 1.0], dtype=torch.float64)
                if self.step % r.train.log_every == 0 or self.done():
                    self._log_train_line(acc_sum, seen, self.trained_s - mark, lr, stats, bar)
                    acc_sum.zero_()
                    seen, mark = 0, self.trained_s
                if bar is not None:
                    bar.update(1)
                if self.eval_interval and (self.step % self.eval_interval == 0) and not self.done():
                    self._periodic_eval()
                    clock = self.clock()
                if r.train.ckpt_every and self.step % r.train.ckpt_every == 0 and not self.done():
                    self.save_checkpoint()
                    last_good = self.step
                    clock = self.clock()
                if self.stop_after is not None and self.step >= self.stop_after:
                    stopped = True
                    break
                if self.done():
                    break
            if stopped:
                break
            if self.step % self.steps_per_epoch == 0 and not r.train.ckpt_every and not self.done():
                self.save_checkpoint()
                last_good = self.step
        if bar is not None:
            bar.close()
        if stopped:
            return {"stopped_at": self.step}
        self.save_checkpoint()
        return self.finish(time.perf_counter() - t0)

    def _progress_bar(self) -> Any:
        """A tqdm bar over the run's steps on the main process when ``progress`` is on, else None."""
        if not (self.progress and self.dist.main):
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.total_steps, initial=self.step, desc=self.recipe.name, unit="step", dynamic_ncols=True,
                    mininterval=1.0)

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor, clock: float, last_good: int
                    ) -> Tuple[float, Dict[str, torch.Tensor], int, float]:
        """One optimiser step on a loaded batch: the schedule's lr and patch-dropout rate, augmentation and
        noise seeded by (seed, step, rank), the training clock advanced from ``clock``, divergence checked
        (on every process), EMA updated, the step counted. Returns (lr, step stats, images, clock)."""
        r, d = self.recipe, self.dist
        step = self.step
        where = self.progress_step()
        lr = self.schedule(where)
        set_lr(self.optimizer, lr)
        # the schedule's patch-dropout rate goes to the forward call (no state written into the model)
        forward_kw = {"patch_drop": self.patch_drop_at(where)} if self.patch_drop_start else {}
        g = torch.Generator().manual_seed(_seed_for(r.train.seed, step, d.rank))
        x, y = self.augment(images, labels, g)
        torch.manual_seed(_seed_for(r.train.seed, step, d.rank, salt=1))  # dropout / stochastic depth
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        stats = self.step_fn(x, y, **forward_kw)
        bad = not bool(torch.isfinite(stats["grad_norm"])) or not bool(torch.isfinite(stats["loss"]))
        now = self.clock()
        self.trained_s += now - clock
        if d.enabled:  # one collective: divergence anywhere, and the slowest process's clock
            agreed = D.all_reduce_max(torch.tensor([float(bad), self.trained_s], dtype=torch.float64), d)
            bad, self.trained_s = bool(agreed[0] > 0), float(agreed[1])
        if bad:
            self._diverged(step, lr, stats, last_good)
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        return lr, stats, x.shape[0], now

    def _log_train_line(self, acc_sum: torch.Tensor, seen: int, elapsed: float, lr: float,
                        stats: Dict[str, torch.Tensor], bar: Any) -> None:
        """One ``kind: train`` line of metrics.jsonl: loss and accuracy averaged since the last line (over
        all processes), throughput over ``elapsed`` training seconds (evaluations and checkpoints excluded)."""
        d = self.dist
        m = D.all_reduce_mean(acc_sum.to(self.device), d).cpu() if d.enabled else acc_sum
        rec = {"kind": "train", "step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4),
               "loss": float(m[0] / m[2]), "acc": float(m[1] / m[2]), "lr": lr,
               "grad_norm": float(stats["grad_norm"]), "img_per_s": seen / max(elapsed, 1e-9),
               "time": round(time.perf_counter() - self._t0, 2)}
        self.log.write(rec)
        if bar is not None:
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{100 * rec['acc']:.1f}%", lr=f"{lr:.2e}",
                            img_s=f"{rec['img_per_s']:.0f}", refresh=False)

    def _diverged(self, step: int, lr: float, stats: Dict[str, torch.Tensor], last_good: int) -> None:
        where = self.out / "checkpoints" / "last.pt"
        has = where.is_file()
        msg = (f"training diverged at step {step + 1}: loss {float(stats['loss']):.4g}, gradient norm "
               f"{float(stats['grad_norm']):.4g} (lr {lr:.3g}). ")
        msg += (f"The last good checkpoint (step {last_good}) is kept at {where}: resume from it with --resume "
                f"and a lower learning rate (--set optim.lr=...), stronger clipping or fp32."
                if has else "No checkpoint was written yet: lower the learning rate or use fp32 and start again.")
        if self.log is not None:
            self.log.write({"kind": "diverged", "step": step + 1, "loss": float(stats["loss"]), "lr": lr})
        raise TrainingDiverged(msg)

    def candidates(self):
        """(kind, model) of the weights a run may export: ``raw`` (the trained module) and, with EMA on,
        ``ema`` (a plain copy holding the averaged weights; collective under FSDP)."""
        yield "raw", self.forward_model
        if self.ema is not None:
            if not hasattr(self, "_ema_model"):  # a plain (unsharded) copy that holds the averaged weights
                self._ema_model = self.wrap_model(VisionTransformer(self.config)).to(self.device)
            shadow = {k: D.full_tensor(v) for k, v in self.ema.shadow.items()}  # collective under FSDP
            self._ema_model.load_state_dict(shadow)
            yield "ema", self._ema_model

    def _periodic_eval(self) -> Dict[str, Any]:
        """Both kinds of weights on the validation split (never the test split)."""
        if self.val_data is None:
            return {}
        scores = {kind: self.evaluator(model, self.val_data) for kind, model in self.candidates()}
        # training time of the whole run (evaluations and checkpoints excluded; resumed parts included)
        rec = eval_record(self.step, round(self.step / self.steps_per_epoch, 4), "val", scores,
                          time=round(time.perf_counter() - self._t0, 2), train_time=round(self.trained_s, 2))
        self.log.write(rec)
        return rec

    # --- the end ------------------------------------------------------------------------------
    def export_model(self, kind: str = "raw") -> Optional[torch.nn.Module]:
        """The ``kind`` weights (raw / ema) as a plain module to publish. Collective under FSDP: every rank
        calls it (None on the other ranks)."""
        if kind == "ema":
            return dict(self.candidates())["ema"]
        if self.recipe.train.distributed == "fsdp" and self.dist.enabled:
            state = D.full_state(self.wrapped)[0]  # gathered on rank 0 only
            if not self.dist.main:
                return None
            plain = self.wrap_model(VisionTransformer(self.config))
            plain.load_state_dict(state)
            return plain
        return self.model

    def preprocessing(self) -> Dict[str, Any]:
        """The evaluation preprocessing of the trained model (the recipe's normalisation at its size), as a
        preset dict."""
        return eval_preprocessing(self.recipe.data, self.config, self.train_data.in_memory, self.load_size)

    def finish(self, wall: float) -> Dict[str, Any]:
        """Choose the weights on the validation split, test them once, export, report
        (:func:`vitkit.train.report.finish_classification`)."""
        return finish_classification(self, wall)


def train(recipe: Recipe, out: PathLike, *, resume: bool = False, progress: bool = True) -> Dict[str, Any]:
    """Train ``recipe`` into the run folder ``out`` (resuming it with ``resume``); returns results.json's dict."""
    trainer = Trainer(recipe, out, resume=resume, progress=progress)
    try:
        return trainer.fit()
    finally:
        del trainer  # collected by teardown, before the process group goes
        D.teardown()
