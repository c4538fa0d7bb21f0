"""One optimiser step: forward, loss, backward over ``accum_steps`` micro-batches, clip, update.

:class:`TrainStep` is the training engine's hot path, usable on its own (and timed by the throughput
benchmarks)::

    step = TrainStep(model, optimizer, precision="bf16", clip_grad=1.0)
    stats = step(images, targets)          # images: normalised float [B, C, H, W]; targets: labels or soft
"""
from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def classification_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy against labels [B] or soft targets [B, K] (Mixup/CutMix), with label smoothing."""
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


class TrainStep:
    """One optimiser step of a classifier: forward (autocast for bf16) and backward over ``accum_steps``
    micro-batches, global-norm clipping, the optimiser's step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, precision: str = "fp32",
                 clip_grad: Optional[float] = 1.0, accum_steps: int = 1, label_smoothing: float = 0.0,
                 device: Optional[torch.device] = None, scaler: Optional[torch.amp.GradScaler] = None):
        self.model, self.optimizer = model, optimizer
        self.clip_grad, self.accum_steps, self.label_smoothing = clip_grad, accum_steps, label_smoothing
        self.device = device or next(model.parameters()).device
        self.precision = precision
        self.params = [p for p in model.parameters() if p.requires_grad]
        # fp16 (CUDA): the loss scaled so small gradients stay representable, unscaled before clipping; a step
        # whose gradients overflowed is skipped and the scale lowered (torch's GradScaler). A training run passes
        # the scaler its run state owns (saved and restored with it); alone, an fp16 step makes its own.
        if scaler is None and precision == "fp16":
            scaler = torch.amp.GradScaler("cuda")
        self.scaler = scaler

    def autocast(self):
        """The context the forward pass runs in: bf16 / fp16 autocast for ``precision='bf16'`` / ``'fp16'``,
        else nothing."""
        if self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def __call__(self, images: torch.Tensor, targets: torch.Tensor, **forward_kw) -> Dict[str, torch.Tensor]:
        """Returns loss, accuracy (against the arg-max target) and the gradient norm before clipping, as
        0-dim tensors (no host sync). ``forward_kw`` go to the model's forward (e.g. ``patch_drop``, the
        schedule's patch-dropout rate of this step)."""
        self.model.train()
        n = self.accum_steps
        chunks = zip(images.chunk(n), targets.chunk(n)) if n > 1 else [(images, targets)]
        total_loss = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device)
        for i, (x, t) in enumerate(chunks):
            sync = _no_sync(self.model) if i < n - 1 else contextlib.nullcontext()
            with sync:
                loss, right = self.loss(x, t, **forward_kw)
                part = loss * (x.shape[0] / images.shape[0])
                (self.scaler.scale(part) if self.scaler is not None else part).backward()
            total_loss += loss.detach() * (x.shape[0] / images.shape[0])
            correct += right
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clipping and the logged norm see the true gradients
        if self.clip_grad:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None]) \
                if hasattr(torch.nn.utils, "get_total_norm") else torch.zeros((), device=self.device)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when the gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total_loss, "acc": correct / images.shape[0], "grad_norm": norm}


    def loss(self, x: torch.Tensor, t: torch.Tensor, **forward_kw) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean loss, number of correct predictions) of one micro-batch. Other objectives override this
        (distillation: ``vitkit.train.distill``, masked patch prediction: ``vitkit.train.mpp``)."""
        with self.autocast():
            logits = self.model(x, **forward_kw)
        loss = classification_loss(logits, t, self.label_smoothing)
        hard = t if t.ndim == 1 else t.argmax(1)
        return loss, (logits.detach().argmax(1) == hard).sum()


@contextlib.contextmanager
def _no_sync(model: nn.Module):
    """Skip the gradient all-reduce on accumulation micro-steps (DDP ``no_sync``, FSDP2 gradient sync off)."""
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
