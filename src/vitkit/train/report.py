"""The classification objective, and the end of a classification run.

:class:`Classification` is the objective of plain supervised training (the distillation objective,
:class:`vitkit.train.distill.Distillation`, builds on it): it trains the ViT itself with cross-entropy
(:class:`~vitkit.train.step.TrainStep`), evaluates top-1 / top-5 / loss on the validation split, and ends
the run with :func:`finish_classification`:

1. The raw and the EMA weights are evaluated on the validation split (when the run has one) and
   :func:`vitkit.train.selection.choose_weights` picks the exported ones.
2. The exported weights, and only they, are evaluated on the test split: the one read of the test
   set in the whole run (a ``kind: test`` line in metrics.jsonl).
3. ``RUN/model`` (vitkit's format, with labels, preprocessing and where the numbers came from),
   ``results.json``, ``curves.png`` and ``predictions.png`` are written.

The report reads the run's set-up, its state and its objective, nothing else.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import nn

from ..checkpoints import save_model
from ..models.kernel_plan import source as backend_source
from ..utils import write_json_atomic
from . import distributed as D
from .checkpoint import RunState
from .optim import unwrap
from .rundata import RunSetup
from .runlog import MetricsLog, plot_curves, plot_predictions
from .selection import choose_weights, eval_record
from .step import TrainStep


class Classification:
    """Supervised classification: cross-entropy (label smoothing, soft Mixup / CutMix targets) on the ViT's
    logits; validation top-1 / top-5 / loss; the exported model chosen on validation, tested once."""

    name = "classification"

    def resolve(self, recipe):
        """The recipe this objective trains (checks it; a copy where the objective fills fields in)."""
        return recipe

    def wrap(self, vit: nn.Module, recipe) -> nn.Module:
        """The module trained around the ViT: the ViT itself."""
        return vit

    def export(self, module: nn.Module) -> nn.Module:
        """The plain model to publish of a trained module (or its EMA copy)."""
        return unwrap(module)

    def readout(self, module: nn.Module) -> nn.Module:
        """The module whose forward gives the logits the evaluation scores (the trained module here)."""
        return module

    def make_step(self, run: RunSetup, state: RunState) -> TrainStep:
        """The optimiser step of this objective over the run's module, optimiser and loss scaler."""
        return TrainStep(run.forward_model, state.optimizer, scaler=state.scaler, **step_options(run))

    def validate(self, run: RunSetup, state: RunState, **extra: Any) -> Dict[str, Any]:
        """The metrics line of a periodic evaluation: both kinds of weights on the validation split (the raw
        weights only with ``train.eval_ema`` off)."""
        scores = {kind: run.evaluator(self.readout(m), run.data.val) for kind, m in run.weights(state, periodic=True)}
        return eval_record(state.step, round(state.step / run.steps_per_epoch, 4), "val", scores, **extra)

    def results(self, run: RunSetup, evaluator) -> Dict[str, Any]:
        """Entries this objective adds to results.json (none here; the teacher's for distillation)."""
        return {}

    def finish(self, run: RunSetup, state: RunState, log: MetricsLog, wall: float) -> Dict[str, Any]:
        """Choose, test once, export, report (:func:`finish_classification`)."""
        return finish_classification(run, state, log, self, wall)


def step_options(run: RunSetup) -> Dict[str, Any]:
    """The recipe's options of every objective's optimiser step (precision, clipping, accumulation ...)."""
    r = run.recipe
    return dict(precision=r.train.precision, clip_grad=r.optim.clip_grad, accum_steps=r.optim.accum_steps,
                label_smoothing=r.augment.label_smoothing, device=run.device)


_SCORES = ("top1", "top5", "loss")


def run_facts(run: RunSetup, state: RunState, wall: float) -> Dict[str, Any]:
    """results.json's entries about the run itself: its length, time, size, processes and kernels."""
    return {"recipe": run.recipe.name, "steps": state.step, "planned_steps": run.total_steps,
            "epochs": round(state.step / run.steps_per_epoch, 3), "trained_s": round(state.trained_s, 1),
            "stopped_by": "steps" if state.step >= run.total_steps else "time budget",
            "train_wall_s": round(wall, 1), "params": run.vit.num_params(), "processes": run.dist.world,
            "device": str(run.device), "train_images": len(run.data.train), "eval_split": run.data.eval_split,
            # the kernels the run declared and the plan its model ran (this run's, not the process's)
            "backend": {"declared": run.recipe.train.backend, "source": backend_source(),
                        "kernel_plan": run.vit.kernel_plan.as_dict()}}


def finish_classification(run: RunSetup, state: RunState, log: MetricsLog, objective: Classification,
                          wall: float) -> Dict[str, Any]:
    """Steps 1-3 above after the run's last step; returns results.json's dict."""
    r, d, data, ev = run.recipe, run.dist, run.data, run.evaluator
    results = run_facts(run, state, wall)
    epochs = results["epochs"]
    models = dict(run.weights(state))  # the EMA copy is filled once (collective under FSDP)
    val: Optional[Dict[str, Dict[str, Any]]] = None
    if data.val is not None:
        val = {kind: ev(objective.readout(model), data.val) for kind, model in models.items()}
        log.write(eval_record(state.step, epochs, "val", val, final=True, train_time=round(state.trained_s, 2)))
        results["val_images"] = len(data.val)
        results["val"] = {kind: {k: res[k] for k in _SCORES} for kind, res in val.items()}
    kind, why = choose_weights(r.train.export, state.ema is not None, val)
    results["exported_weights"], results["selected_by"] = kind, why
    probs = None
    if data.test is not None:  # the one evaluation of the test split: the exported weights only
        res = ev(objective.readout(models[kind]), data.test, keep_probs=True)
        probs = res.get("probs")
        results["test_images"] = len(data.test)
        results.update({f"test_{k}": res[k] for k in _SCORES})
        log.write({"kind": "test", "split": "test", "step": state.step, "epoch": epochs, "weights": kind,
                   **{k: res[k] for k in _SCORES}, "train_time": round(state.trained_s, 2)})
    results.update(objective.results(run, ev))  # e.g. the teacher's accuracy on the same images
    exported = run.export_module(state, kind)  # collective under FSDP
    if d.main:
        extra = {"recipe": r.name, "steps": state.step, "weights": kind, "selected_by": why}
        if val is not None:
            extra["val_top1"] = val[kind]["top1"]
        if "test_top1" in results:
            extra["test_top1"] = results["test_top1"]
        save_model(exported, run.out / "model", labels=data.classes, preprocessing=run.preprocessing(), extra=extra)
        results["model"] = str(run.out / "model")
        write_json_atomic(run.out / "results.json", results)
        headline = (f"test top-1 {100 * results['test_top1']:.2f}%" if "test_top1" in results
                    else f"validation top-1 {100 * val[kind]['top1']:.2f}%" if val else "no evaluation split")
        plot_curves(run.out, title=f"{r.name}: {headline} ({kind} weights)")
        if probs is not None and r.train.predictions:
            n = min(r.train.predictions, len(data.test))
            idx = torch.linspace(0, len(data.test) - 1, n).long()
            imgs, lbls = data.test.gather(idx)
            plot_predictions(imgs, lbls, probs[idx], data.classes, run.out / "predictions.png")
    D.barrier(d)
    return results
