"""The end of a classification run: choose the weights, test them once, export them, report.

1. The raw and the EMA weights are evaluated on the validation split (when the run has one) and
   :func:`vitkit.train.selection.choose_weights` picks the exported ones.
2. The exported weights, and only they, are evaluated on the test split: the one read of the test
   set in the whole run (a ``kind: test`` line in metrics.jsonl).
3. ``RUN/model`` (vitkit's format, with labels, preprocessing and where the numbers came from),
   ``results.json``, ``curves.png`` and ``predictions.png`` are written.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ..checkpoints import save_model
from ..models.kernel_plan import source as backend_source
from ..utils import write_json_atomic
from . import distributed as D
from .optim import unwrap
from .runlog import plot_curves, plot_predictions
from .selection import choose_weights, eval_record

_SCORES = ("top1", "top5", "loss")


def finish_classification(tr: Any, wall: float) -> Dict[str, Any]:
    """Steps 1-3 above for the trainer ``tr`` (a :class:`~vitkit.train.trainer.Trainer`, which calls this and
    is not imported here) after its last step; returns results.json's dict."""
    r, d = tr.recipe, tr.dist
    epochs = round(tr.step / tr.steps_per_epoch, 3)
    results: Dict[str, Any] = {"recipe": r.name, "steps": tr.step, "planned_steps": tr.total_steps,
                               "epochs": epochs, "trained_s": round(tr.trained_s, 1),
                               "stopped_by": "steps" if tr.step >= tr.total_steps else "time budget",
                               "train_wall_s": round(wall, 1), "params": unwrap(tr.model).num_params(),
                               "processes": d.world, "device": str(tr.device),
                               "train_images": len(tr.train_data), "eval_split": tr.eval_split}
    # the kernels the run declared and the plan its model ran (this run's, not the process's)
    results["backend"] = {"declared": r.train.backend, "source": backend_source(),
                          "kernel_plan": unwrap(tr.model).kernel_plan.as_dict()}
    models = dict(tr.candidates())  # the EMA copy is filled once (collective under FSDP)
    val = None
    if tr.val_data is not None:
        val = {kind: tr.evaluator(model, tr.val_data) for kind, model in models.items()}
        tr.log.write(eval_record(tr.step, epochs, "val", val, final=True, train_time=round(tr.trained_s, 2)))
        results["val_images"] = len(tr.val_data)
        results["val"] = {kind: {k: res[k] for k in _SCORES} for kind, res in val.items()}
    kind, why = choose_weights(r.train.export, tr.ema is not None, val)
    results["exported_weights"], results["selected_by"] = kind, why
    chosen = models[kind]
    probs = None
    if tr.test_data is not None:  # the one evaluation of the test split: the exported weights only
        res = tr.evaluator(chosen, tr.test_data, keep_probs=True)
        probs = res.get("probs")
        results["test_images"] = len(tr.test_data)
        results.update({f"test_{k}": res[k] for k in _SCORES})
        tr.log.write({"kind": "test", "split": "test", "step": tr.step, "epoch": epochs, "weights": kind,
                      **{k: res[k] for k in _SCORES}, "train_time": round(tr.trained_s, 2)})
    if tr.distillation is not None:  # how the student compares with its teacher, on the same images
        results.update(tr.distillation.report(tr.test_data, tr.evaluator))
    exported = chosen if kind == "ema" else tr.export_model(kind)  # collective under FSDP
    if d.main:
        extra = {"recipe": r.name, "steps": tr.step, "weights": kind, "selected_by": why}
        if val is not None:
            extra["val_top1"] = val[kind]["top1"]
        if "test_top1" in results:
            extra["test_top1"] = results["test_top1"]
        save_model(unwrap(exported), tr.out / "model", labels=tr.classes, preprocessing=tr.preprocessing(),
                   extra=extra)
        results["model"] = str(tr.out / "model")
        write_json_atomic(tr.out / "results.json", results)
        headline = (f"test top-1 {100 * results['test_top1']:.2f}%" if "test_top1" in results
                    else f"validation top-1 {100 * val[kind]['top1']:.2f}%" if val else "no evaluation split")
        plot_curves(tr.out, title=f"{r.name}: {headline} ({kind} weights)")
        if probs is not None and r.train.predictions:
            n = min(r.train.predictions, len(tr.test_data))
            idx = torch.linspace(0, len(tr.test_data) - 1, n).long()
            imgs, lbls = tr.test_data.gather(idx)
            plot_predictions(imgs, lbls, probs[idx], tr.classes, tr.out / "predictions.png")
    D.barrier(d)
    return results
