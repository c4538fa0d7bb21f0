"""Masked patch prediction pre-training (Section 4.6, Appendix B.1.2) on the training engine.

``pretrain_mpp(recipe, out)`` runs the engine's loop (optimiser, schedule, run folder, checkpoints,
exact resume) with the MPP objective (:class:`MaskedPatchObjective`) instead of classification; labels
are never read. The recipe's ``mpp`` section sets the target and the corruption; the paper's optimiser
is Adam, lr 2e-4, linear warm-up and cosine decay (``mpp-paper`` scales its 1M steps at batch 4096 to
the data). The run folder gets, besides the engine's files:

    model/         the pre-trained ViT (no head) in vitkit's format: fine-tune it with ``vitkit finetune``
    mpp.png        original / corrupted / predicted colours for a few held-out images
    results.json   MPP loss and accuracy on the corrupted patches of the evaluation split
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..checkpoints import save_model
from ..errors import ConfigError, InputError
from ..models.mpp import KEPT, MASKED, NONE, RANDOM, MaskedPatchPrediction, patchify
from ..utils import PathLike, atomic_path, write_json_atomic
from . import distributed as D
from .checkpoint import RunState
from .optim import unwrap
from .recipe import Recipe
from .report import step_options
from .rundata import RunSetup
from .runlog import MetricsLog, plot_curves
from .sections import check_mpp
from .step import TrainStep
from .trainer import train


class MPPStep(TrainStep):
    """The engine's step with the MPP loss; 'acc' is the share of corrupted patches whose target class is
    predicted (0 for the pixel-regression target)."""

    def loss(self, x: torch.Tensor, t: torch.Tensor, **forward_kw) -> Tuple[torch.Tensor, torch.Tensor]:
        if forward_kw:  # MPP sees every patch (the corrupted ones are its targets): no patch dropout
            raise InputError(f"masked patch prediction takes no forward options, got {sorted(forward_kw)}")
        with self.autocast():
            out = self.model(x)
        correct = out["correct"] if out["correct"] is not None else torch.zeros((), device=x.device)
        return out["loss"], correct * (x.shape[0] / out["count"].clamp_min(1))


class MaskedPatchObjective:
    """Masked patch prediction as a training objective: the ViT (no classification head) is wrapped with a
    mask embedding and a prediction head; evaluation reports the held-out MPP loss; the exported model is
    the bare ViT."""

    name = "mpp"

    def resolve(self, recipe: Recipe) -> Recipe:
        """Checks the recipe fits MPP; a copy whose model has no classification head (labels are never used)."""
        check_mpp(recipe.mpp)
        if recipe.model.get("patch_drop"):
            raise ConfigError("masked patch prediction must see every patch (the corrupted ones are its targets): "
                              "set model.patch_drop=0 for MPP")
        if recipe.augment.mixes:
            raise ConfigError("Mixup/CutMix blend images, so the patch targets would be blends too: turn "
                              "augment.mixup and augment.cutmix off for MPP")
        if recipe.distill.teacher:
            raise ConfigError("distill.teacher is for classification training, not for masked patch prediction")
        return dataclasses.replace(recipe, model={**recipe.model, "num_classes": 0})

    def wrap(self, vit: nn.Module, recipe: Recipe) -> nn.Module:
        m, dc = recipe.mpp, recipe.data
        return MaskedPatchPrediction(vit, m.target, bits=m.bits, ratio=m.ratio, p_mask=m.p_mask,
                                     p_random=m.p_random, pixel_mean=dc.mean, pixel_std=dc.std)

    def export(self, module: nn.Module) -> nn.Module:
        """The pre-trained ViT alone."""
        return unwrap(module).vit

    def make_step(self, run: RunSetup, state: RunState) -> MPPStep:
        return MPPStep(run.forward_model, state.optimizer, scaler=state.scaler, **step_options(run))

    # --- evaluation: the MPP loss on a fixed subset of the evaluation split, fixed corruption -----------
    @torch.no_grad()
    def score(self, run: RunSetup, model: nn.Module, data) -> Dict[str, float]:
        """MPP loss and accuracy of ``model`` on (a fixed subset of) ``data``, with a fixed corruption."""
        r = run.recipe
        n = len(data) if not r.mpp.eval_images else min(len(data), r.mpp.eval_images)
        idx = torch.linspace(0, len(data) - 1, n).long()
        g = torch.Generator(device=run.device).manual_seed(r.train.seed + 17)
        was = model.training
        model.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        bs = r.data.eval_batch_size
        for i in range(0, n, bs):
            images, _ = data.gather(idx[i:i + bs])
            x = run.eval_tf(images).to(run.device)
            out = unwrap(model)(x, generator=g)
            k = float(out["count"])
            sums += torch.tensor([float(out["loss"]) * k, float(out["correct"] or 0.0), k], dtype=torch.float64)
        model.train(was)
        return {"mpp_loss": float(sums[0] / sums[2]), "mpp_acc": float(sums[1] / sums[2]), "n": n}

    def validate(self, run: RunSetup, state: RunState, **extra: Any) -> Dict[str, Any]:
        rec: Dict[str, Any] = {"kind": "eval", "split": "val", "step": state.step,
                               "epoch": round(state.step / run.steps_per_epoch, 4)}
        for kind, model in run.weights(state, periodic=True):
            for k, v in self.score(run, model, run.data.val).items():
                if k != "n":
                    rec[k + ("" if kind == "raw" else "_" + kind)] = v
        return rec

    def finish(self, run: RunSetup, state: RunState, log: MetricsLog, wall: float) -> Dict[str, Any]:
        """The exported weights' MPP loss on the held-out images (the validation split if any, else the test
        split), the bare ViT exported, results.json, curves.png and mpp.png."""
        r, d = run.recipe, run.dist
        results: Dict[str, Any] = {"recipe": r.name, "objective": "mpp", "mpp": asdict(r.mpp), "steps": state.step,
                                   "epochs": round(state.step / run.steps_per_epoch, 3),
                                   "train_wall_s": round(wall, 1), "device": str(run.device),
                                   "params": run.vit.num_params(), "eval_split": run.data.eval_split}
        final = run.data.val if run.data.val is not None else run.data.test
        split = "val" if run.data.val is not None else "test"
        # MPP has no accuracy to choose on: the EMA weights if on (unless train.export=raw)
        kind = "ema" if state.ema is not None and r.train.export in ("auto", "ema") else "raw"
        results["exported_weights"] = kind
        shown = dict(run.weights(state))[kind]  # the model drawn in mpp.png: the exported one
        if final is not None:
            res = self.score(run, shown, final)
            log.write({"kind": "eval", "split": split, "step": state.step, "epoch": results["epochs"],
                       "final": True, "weights": kind, "mpp_loss": res["mpp_loss"], "mpp_acc": res["mpp_acc"]})
            results.update({f"{split}_mpp_loss": res["mpp_loss"], f"{split}_mpp_acc": res["mpp_acc"]})
        vit = run.export_module(state, kind)  # collective under FSDP
        if d.main:
            save_model(vit, run.out / "model", preprocessing=run.preprocessing(),
                       extra={"recipe": r.name, "steps": state.step, "objective": "masked patch prediction",
                              "mpp": asdict(r.mpp)})
            results["model"] = str(run.out / "model")
            write_json_atomic(run.out / "results.json", results)
            plot_curves(run.out, title=f"{r.name}: masked patch prediction ({r.mpp.target})")
            if final is not None and r.mpp.figure_images:
                n = min(r.mpp.figure_images, len(final))
                images, _ = final.gather(torch.linspace(0, len(final) - 1, n).long())
                plot_mpp(unwrap(shown), run.eval_tf(images).to(run.device), run.out / "mpp.png",
                         title=f"{r.name}: masked patch prediction ({r.mpp.target}), step {state.step}",
                         seed=r.train.seed)
        D.barrier(d)
        return results


def pretrain_mpp(recipe: Recipe, out: PathLike, *, resume: bool = False, progress: bool = True) -> Dict[str, Any]:
    """MPP pre-training of ``recipe`` into the run folder ``out``; returns results.json's dict."""
    return train(recipe, out, resume=resume, progress=progress, objective=MaskedPatchObjective())


# --- the figure ---------------------------------------------------------------------------------------
@torch.no_grad()
def plot_mpp(model: MaskedPatchPrediction, x: torch.Tensor, out: PathLike, *, title: Optional[str] = None,
             seed: int = 0) -> Optional[Path]:
    """mpp.png: per image, the original, the corrupted input (masked patches grey with a red frame,
    replaced ones showing the other patch, kept ones framed in green), the true mean colour of every patch
    (3-bit) and the model's predicted mean colours on the corrupted (framed) patches, true colours elsewhere.
    None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    was = model.training
    model.eval()
    g = torch.Generator(device=x.device).manual_seed(seed + 23)
    res = model.predict_colors(x, g)
    model.train(was)
    pix = model.pixels(x).cpu()  # [B, C, H, W] in [0, 1]
    b, c, h, w = pix.shape
    ph, pw = model.patch
    gh, gw = h // ph, w // pw
    kind, source = res["kind"].cpu(), res["source"].cpu()
    bits = model.bits
    true_q = _quantised(res["true"].cpu(), bits)
    pred = res["predicted"].cpu()
    patches = patchify(pix, (ph, pw))  # [B, N, C, ph, pw]
    flat = patches.reshape(b * gh * gw, c, ph, pw)
    cols = ["original", "corrupted input", f"true mean colour ({bits}-bit)", "predicted (framed patches)"]
    fig, axes = plt.subplots(b, 4, figsize=(8.4, 2.2 * b), squeeze=False)
    for i in range(b):
        shown_pred = true_q[i].clone()  # untouched patches keep their true colour; framed ones are predicted
        hit = kind[i] != NONE
        shown_pred[hit] = pred[i][hit]
        views = [pix[i], _unpatchify(_corrupted(patches[i], kind[i], source[i], flat), gh, gw),
                 _colour_grid(true_q[i], gh, gw, ph, pw), _colour_grid(shown_pred, gh, gw, ph, pw)]
        for j, v in enumerate(views):
            ax = axes[i, j]
            arr = v.permute(1, 2, 0).numpy()
            ax.imshow(arr[..., 0] if c == 1 else arr, cmap="gray" if c == 1 else None, vmin=0, vmax=1,
                      interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(cols[j], fontsize=8)
            if j in (1, 3):
                _frame_patches(ax, kind[i], gw, (ph, pw))
    fig.suptitle((title or "masked patch prediction") +
                 "\nframes: red = [mask], orange = another patch, green = kept", fontsize=9)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return Path(out)


def _corrupted(patches: torch.Tensor, kind: torch.Tensor, source: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """One image's patches [N, C, ph, pw] as corrupted for the model: masked ones grey, replaced ones showing
    the other patch (``source`` indexes ``flat``, the batch's patches), kept ones as they are."""
    corrupted = patches.clone()
    for n in range(len(patches)):
        if kind[n] == MASKED:
            corrupted[n] = 0.5
        elif kind[n] == RANDOM:
            corrupted[n] = flat[int(source[n])]
    return corrupted


def _frame_patches(ax: Any, kind: torch.Tensor, gw: int, patch: Tuple[int, int]) -> None:
    """Frame the corrupted patches of one image on ``ax``: red [mask], orange another patch, green kept."""
    from matplotlib.patches import Rectangle

    ph, pw = patch
    for n in range(len(kind)):
        k = int(kind[n])
        if k == NONE:
            continue
        colour = {MASKED: "red", RANDOM: "orange", KEPT: "lime"}[k]
        r0, c0 = divmod(n, gw)
        ax.add_patch(Rectangle((c0 * pw - 0.5, r0 * ph - 0.5), pw, ph, fill=False, lw=0.8, edgecolor=colour))


def _quantised(colours: torch.Tensor, bits: int) -> torch.Tensor:
    levels = 2 ** bits
    return ((colours * levels).floor().clamp(0, levels - 1) + 0.5) / levels


def _colour_grid(colours: torch.Tensor, gh: int, gw: int, ph: int, pw: int) -> torch.Tensor:
    """[N, C] colours -> an image [C, gh*ph, gw*pw] with each patch filled by its colour."""
    c = colours.shape[-1]
    grid = colours.reshape(gh, gw, c).permute(2, 0, 1)
    return grid.repeat_interleave(ph, 1).repeat_interleave(pw, 2)


def _unpatchify(patches: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    n, c, ph, pw = patches.shape
    return patches.reshape(gh, gw, c, ph, pw).permute(2, 0, 3, 1, 4).reshape(c, gh * ph, gw * pw)
