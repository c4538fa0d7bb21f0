"""One (arm, seed): its recipe, its run folder, and training it (reused when finished, resumed when
interrupted).

Layout under the output folder::

    runs/RUN/seedS/          a normal vitkit run folder (recipe.yaml, metrics.jsonl, checkpoints/, model/,
                             results.json) plus provenance.json (code version, machine; written when the
                             run starts) and measures.json (written once the run is measured)
    runs/RUN/seedS-init/     for arms that start from altered weights (claim 5's re-initialised embeddings)
    data/SPEC-classesXYZ.npz a class subset of the dataset (claim 10's transfer arms)
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from ..errors import ConfigError
from ..models.kernel_plan import current as current_backend
from ..utils import PathLike, exclusive
from .budget import Budget, evaluation_overrides, validation_overrides
from .claims import HALVES, Arm
from .measure import record_provenance

DESIGN = "design.json"  # OUT/runs/design.json: a v3 campaign's design, made before its first run
REPLAN = "replan.json"  # OUT/runs/replan.json: its seeds planned again once the sweep has chosen (.replan)


def run_folder(root: PathLike, arm: str, seed: int) -> Path:
    return Path(root) / "runs" / arm / f"seed{seed}"


def init_folder(arm: Arm, seed: int, root: PathLike) -> Path:
    return Path(root) / "runs" / arm.name / f"seed{seed}-init"


def is_done(folder: Path) -> bool:
    return (folder / "results.json").is_file() and (folder / "model").is_dir()


def _length(arm: Arm, b: Budget) -> Dict[str, Any]:
    """The schedule of one arm under ``b``, ``arm.stretch`` times the budget's; a v3 budget evaluates every
    arm that classifies ``b.curve_points`` times on validation (its curve for the convergence rule)."""
    k, v3 = arm.stretch, b.version >= 3
    if arm.length in ("main", "finetune"):
        epochs = k * (b.epochs if arm.length == "main" else b.finetune_epochs)
        return {"data.train_subset": b.train_images,
                "schedule.epochs": epochs, "schedule.warmup_epochs": round(0.1 * epochs, 4),
                "train.eval_every": _every(epochs, b) if v3 else 1 if b.curves else 0}
    if arm.length == "data":
        steps = int(round(k * b.data_steps))
        return {"data.train_subset": arm.train_images, "schedule.steps": steps,
                "schedule.warmup_steps": max(1, steps // 10),
                "train.eval_every": _every(steps * _batch(arm, b) / _images(arm, b), b) if v3 else 0}
    if arm.length == "mpp":  # masked patch prediction: v3 keeps its curve (accuracy on the corrupted patches)
        epochs = k * b.mpp_epochs
        return {"schedule.epochs": epochs, "schedule.warmup_epochs": round(0.25 * epochs, 4),
                "train.eval_every": _every(epochs, b) if v3 else 0}
    if arm.length == "few_labels":
        epochs = k * b.few_label_epochs
        return {"data.train_subset": b.few_labels, "schedule.epochs": epochs,
                "schedule.warmup_epochs": round(min(5.0, epochs / 12), 4),
                "train.eval_every": _every(epochs, b) if v3 else round(epochs / 10, 4) if b.curves else 0}
    if arm.length == "none":
        return {}
    raise ConfigError(f"arm {arm.name}: unknown length {arm.length!r}")


def _every(epochs: float, b: Budget) -> float:
    return round(epochs / max(1, b.curve_points), 6)


def _batch(arm: Arm, b: Budget) -> int:
    from ..train import load_recipe

    return int(b.extra.get("optim.batch_size") or load_recipe(arm.recipe, {}).optim.batch_size)


def _images(arm: Arm, b: Budget) -> int:
    """Training images of a claim-3 arm: its subset, or the training split after the hold-out."""
    from .estimate import TRAIN_IMAGES, VAL_IMAGES

    return int(arm.train_images or TRAIN_IMAGES + VAL_IMAGES - (b.val_size or VAL_IMAGES))


def recipe_overrides(arm: Arm, seed: int, budget: Budget, root: Path, classes: Optional[str] = None
                     ) -> Dict[str, Any]:
    """The recipe keys (``--set`` semantics) of one arm at one seed under a budget; ``classes`` (default:
    the arm's) restricts the data to those classes."""
    ov: Dict[str, Any] = {}
    model = arm.full_model()
    if model is not None:
        ov["model"] = model
    ov.update(_length(arm, budget))
    ov.update(validation_overrides(budget.val_size))
    ov.update(evaluation_overrides(budget.test_images))
    ov.update({"train.seed": seed, "train.ckpt_every": 0, "train.predictions": 0, "name": f"reproduce-{arm.name}"})
    if budget.version >= 3:  # the convergence rule reads the raw weights' curve: the EMA's is not evaluated
        ov["train.eval_ema"] = False
    # every run of a campaign computes with the same kernels, on any machine: the declared backend's fixed fields,
    # the rest pinned (gemm=aten,attention=fused,int8=x86), never a per-machine measurement
    ov["train.backend"] = current_backend().pinned().spec
    if arm.lr is not None and arm.kind != "init":
        ov["optim.lr"] = arm.lr
    if arm.parent:
        ov["init.checkpoint"] = str(init_folder(arm, seed, root) if arm.prepare else
                                    run_folder(root, arm.parent, seed) / "model")
    ov.update(arm.overrides)
    ov.update(budget.extra)
    classes = arm.classes if classes is None else classes
    if classes:
        from ..train import load_recipe

        dc = load_recipe(arm.recipe, ov).data
        ov["data.dataset"] = "tensors:" + str(subset_file(root, dc.dataset, classes))
    return ov


def subset_file(root: PathLike, spec: str, classes: str) -> Path:
    tag = re.sub(r"[^A-Za-z0-9]+", "-", Path(spec.split(":", 1)[-1]).name if ":" in spec else spec).strip("-")
    return Path(root) / "data" / f"{tag}-{classes}-classes.npz"


def ensure_subset(recipe_dataset: str, base_spec: str, root_dir: Optional[str], classes: str) -> None:
    """Write the class subset (train and test splits, labels renumbered 0..k-1) once: the even or the odd
    class indices of the dataset."""
    import numpy as np

    from ..data.datasets import open_dataset
    from ..utils import atomic_path

    path = Path(recipe_dataset.split(":", 1)[1])
    if path.is_file():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: Dict[str, Any] = {}
    for split in ("train", "test"):
        d = open_dataset(base_spec, split, root=root_dir)
        chosen = [c for c in range(len(d.classes)) if c % 2 == HALVES[classes]]
        keep = torch.isin(d.labels, torch.tensor(chosen))
        arrays[f"{split}_images"] = d.images[keep].numpy()
        arrays[f"{split}_labels"] = (d.labels[keep] // 2).numpy().astype(np.int64)  # renumbered 0..k-1
        names = [d.classes[c] for c in chosen]
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, classes=np.array(names), **arrays)


def load_arm_recipe(arm: Arm, seed: int, budget: Budget, root: Path, classes: Optional[str] = None):
    """The arm's recipe, with its class subset written to disk if it has one."""
    from ..train import load_recipe

    classes = arm.classes if classes is None else classes
    recipe = load_recipe(arm.recipe, recipe_overrides(arm, seed, budget, root, classes))
    if classes:
        base = load_recipe(arm.recipe, recipe_overrides(arm, seed, budget, root, ""))
        ensure_subset(recipe.data.dataset, base.data.dataset, base.data.root, classes)
    return recipe


def run_arm(arm: Arm, seed: int, budget: Budget, root: PathLike, *, progress: bool = False,
            stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Train one (arm, seed) into its run folder: reuse a finished run, resume an interrupted one.
    ``stop_after`` stops the training after that many steps, as a kill would (for tests)."""
    root = Path(root)
    out = run_folder(root, arm.name, seed)
    recipe = load_arm_recipe(arm, seed, budget, root)
    if is_done(out):
        _check_same_recipe(out, recipe, root)
        return json.loads((out / "results.json").read_text())
    # one process per run folder: a second invocation (or a worker left over from a killed one) stops here
    with exclusive(out.parent / f"{out.name}.lock", wait=False,
                   busy=f"{out} is being trained by another process: wait for it, or stop it first"):
        if is_done(out):  # finished while we waited for the lock's holder
            return json.loads((out / "results.json").read_text())
        record_provenance(out, budget.plan_sha)
        if arm.kind == "init":
            return _untrained(arm, seed, recipe, out)
        if arm.prepare:
            _prepare(arm, seed, root, recipe)
        resume = (out / "checkpoints" / "last.pt").is_file()
        if resume:
            _check_same_recipe(out, recipe, root)
        from ..train.mpp import MaskedPatchObjective
        from ..train.trainer import Trainer
        trainer = Trainer(recipe, out, resume=resume, progress=progress, stop_after=stop_after,
                          objective=MaskedPatchObjective() if arm.kind == "mpp" else None)
        from ..train import distributed as D
        try:
            return trainer.fit()
        finally:
            D.teardown()


def _untrained(arm: Arm, seed: int, recipe, out: Path) -> Dict[str, Any]:
    """The architecture at its initialisation for this seed (claim 9's reference), saved as a model folder."""
    from ..checkpoints import save_model
    from ..models import VisionTransformer
    from ..utils import write_json_atomic
    from .measure import open_split
    data = open_split(recipe.data.dataset, recipe.data.train_split, recipe.data.root)
    classes = list(data.classes)
    torch.manual_seed(seed)
    model = VisionTransformer(recipe.model_config(num_classes=len(classes), in_chans=data.channels))
    save_model(model, out / "model", labels=classes, extra={"note": "untrained: the initialisation of this seed"})
    (out / "recipe.yaml").write_text(recipe.to_yaml())
    res = {"recipe": recipe.name, "steps": 0, "trained_s": 0.0, "untrained": True}
    write_json_atomic(out / "results.json", res)
    return res


def _check_same_recipe(out: Path, recipe, root: Path) -> None:
    import yaml

    saved, now = yaml.safe_load((out / "recipe.yaml").read_text()), yaml.safe_load(recipe.to_yaml())
    for d in (saved, now):  # an MPP run records its head-less model (num_classes 0) itself
        d["model"].pop("num_classes", None)
    if (now.get("train") or {}).get("backend") is None:  # auto: the run records what it resolved to
        for d in (saved, now):
            (d.get("train") or {}).pop("backend", None)
    # paths inside OUT (a fine-tune's parent, a class subset): the same run whatever OUT is called now
    for section, key in (("init", "checkpoint"), ("data", "dataset")):
        a, b = (saved.get(section) or {}).get(key), (now.get(section) or {}).get(key)
        if a and b and a != b:
            tail = _inside(b.split("tensors:", 1)[-1], root)
            if tail and Path(a.split("tensors:", 1)[-1]).parts[-len(tail):] == tail:
                saved[section][key] = b
    if saved != now:
        raise ConfigError(f"{out} holds a run of another configuration (a different budget or vitkit version?): "
                          f"give another --out, or delete that folder to run it again")


def _inside(path: str, root: Path) -> Optional[tuple]:
    try:
        return Path(path).relative_to(root).parts or None
    except ValueError:
        return None


def _prepare(arm: Arm, seed: int, root: Path, recipe) -> None:
    """Starting weights that are not simply the parent's model (written once)."""
    dest = init_folder(arm, seed, root)
    if (dest / "vitkit.json").is_file() and (dest / "model.safetensors").is_file():
        return
    from ..checkpoints import save_model
    from ..models import VisionTransformer
    from ..train.weights import load_for_eval

    if arm.prepare != "reinit_posemb":
        raise ConfigError(f"arm {arm.name}: unknown preparation {arm.prepare!r}")
    model, labels, pre = load_for_eval(run_folder(root, arm.parent, seed) / "model")
    if model.pos_embed is None:
        raise ConfigError(f"arm {arm.name}: re-initialising position embeddings needs posemb='learn'")
    size = recipe.model.get("img_size", model.config.img_size)
    model.set_img_size(size)
    torch.manual_seed(seed)
    fresh = VisionTransformer(model.config)  # the model's own initialisation at the new grid
    with torch.no_grad():
        model.pos_embed.copy_(fresh.pos_embed)
    save_model(model, dest, labels=labels, preprocessing=pre, extra={"note": "position embeddings re-initialised"})
