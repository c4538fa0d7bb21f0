"""Knowledge distillation from a trained teacher (DeiT: Touvron et al. 2021, Section 5; Hinton et al. 2015).

The recipe's ``distill`` section names the teacher (any checkpoint vitkit loads: a vitkit folder such as
``RUN/model``, a timm / torchvision / Hugging Face file, the authors' .npz; hybrids included) and the
student is trained on

    (1 - alpha) * CE(student, labels) + alpha * teacher term

with the teacher term ``hard``: cross-entropy against the teacher's arg-max class (DeiT's hard-label
distillation, its best variant), or ``soft``: tau^2 * KL(teacher || student) of the temperature-tau
distributions. The teacher sees the same augmented batch as the student (DeiT's choice), converted to
its own preprocessing (mean / std, resolution), in eval mode and without gradients.

A student with one head learns both terms on its class token (DeiT's "usual distillation"). A student
built with ``distill_token=True`` (DeiT's distillation token, ``model.distill_token`` in the recipe)
learns the label term on its class head and the teacher term on its distillation head: the objective
trains it inside :class:`TwoHeads`, whose forward gives both heads' logits (the model itself is not
switched into another mode); it predicts, is evaluated and is exported as the bare ViT, with the mean of
the two heads, as DeiT's distilled models do.

:class:`Distillation` is the objective: it loads the teacher, makes the step that mixes its predictions
into the loss, and adds the teacher's own test accuracy to the run's results.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..data.augment import Normalize, resize
from ..errors import ConfigError, NotFoundError
from .checkpoint import RunState
from .evaluate import transform_for
from .optim import unwrap
from .report import Classification, step_options
from .rundata import RunSetup
from .sections import DistillConfig
from .selection import Evaluator
from .step import TrainStep, classification_loss

KINDS = ("hard", "soft")


class TeacherInput:
    """Student-normalised batch -> the teacher's input: pixels back from the student's mean / std, resized
    to the teacher's resolution, normalised with the teacher's mean / std (grey <-> RGB as Normalize does).
    The identity when both preprocessings agree."""

    def __init__(self, student: Normalize, student_size: Sequence[int], teacher: Normalize,
                 teacher_size: Sequence[int]):
        self.student, self.teacher = student, teacher
        self.size = tuple(teacher_size)
        same_stats = ([float(v) for v in student.mean], [float(v) for v in student.std]) == \
            ([float(v) for v in teacher.mean], [float(v) for v in teacher.std])
        self.identity = same_stats and tuple(student_size) == self.size and student.channels == teacher.channels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return x
        pixels = self.student.invert(x.float())
        if tuple(pixels.shape[-2:]) != self.size:
            pixels = resize(pixels, self.size)
        return self.teacher(pixels)


class TwoHeads(nn.Module):
    """A student with a distillation token as the distillation objective trains it: the forward gives the
    class head's logits (token 0) and the distillation head's (token 1) apart, for a loss on each (DeiT)."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor, patch_drop: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        # the ViT's own read-out (forward_outputs: the last block for the rows its heads read only), both heads
        return self.vit.forward_outputs(x, patch_drop=patch_drop).heads

    def no_weight_decay(self):
        return {"vit." + k for k in self.vit.no_weight_decay()}


class DistillStep(TrainStep):
    """:class:`TrainStep` whose loss mixes the labels with a teacher's predictions. The model gives the
    logits, or (class logits, distillation logits) when trained inside :class:`TwoHeads`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, teacher: nn.Module,
                 teacher_input=None, kind: str = "hard", alpha: float = 0.5, tau: float = 1.0, **kw: Any):
        super().__init__(model, optimizer, **kw)
        if kind not in KINDS:
            raise ConfigError(f"distillation kind {kind!r}: use {' or '.join(KINDS)}")
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher_input = teacher_input or (lambda x: x)
        self.kind, self.alpha, self.tau = kind, float(alpha), float(tau)

    def loss(self, x: torch.Tensor, t: torch.Tensor, **forward_kw) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), self.autocast():
            teacher_logits = self.teacher(self.teacher_input(x)).float()
        with self.autocast():
            out = self.model(x, **forward_kw)
        logits, dist_logits = out if isinstance(out, tuple) else (out, None)
        loss = distillation_loss(logits, t, teacher_logits, kind=self.kind, alpha=self.alpha, tau=self.tau,
                                 label_smoothing=self.label_smoothing, dist_logits=dist_logits)
        if dist_logits is not None:  # predictions as at test time: the mean of the two heads
            logits = (logits + dist_logits) / 2
        hard = t if t.ndim == 1 else t.argmax(1)
        return loss, (logits.detach().argmax(1) == hard).sum()


def distillation_loss(logits: torch.Tensor, targets: torch.Tensor, teacher_logits: torch.Tensor, *,
                      kind: str = "hard", alpha: float = 0.5, tau: float = 1.0, label_smoothing: float = 0.0,
                      dist_logits: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(1 - alpha) * CE(logits, targets) + alpha * (CE against the teacher's arg-max | tau^2 * KL(teacher ||
    student) at temperature tau). ``targets``: labels [B] or soft targets [B, K] (Mixup / CutMix).
    ``dist_logits``: a distillation head's logits, which then take the teacher term (DeiT's distillation
    token); otherwise ``logits`` take both."""
    logits = logits.float()
    student = logits if dist_logits is None else dist_logits.float()
    if kind == "hard":
        teacher_term = F.cross_entropy(student, teacher_logits.argmax(1))
    elif kind == "soft":
        teacher_term = F.kl_div(F.log_softmax(student / tau, 1), F.log_softmax(teacher_logits.float() / tau, 1),
                                reduction="batchmean", log_target=True) * (tau * tau)
    else:
        raise ConfigError(f"distillation kind {kind!r}: use {' or '.join(KINDS)}")
    if alpha >= 1.0:
        return teacher_term
    return (1.0 - alpha) * classification_loss(logits, targets, label_smoothing) + alpha * teacher_term


def load_teacher(path: str, classes: List[str], *, num_heads: Optional[int] = None
                 ) -> Tuple[nn.Module, Dict[str, Any]]:
    """The teacher model (eval mode, frozen) and its preprocessing record; checks that it predicts the
    student's classes (same count, and the same names in the same order when the checkpoint lists them)."""
    from ..checkpoints import load_weights

    try:
        model = load_weights(path, num_heads=num_heads)
    except NotFoundError as err:
        raise NotFoundError(f"distill.teacher names no model ({err.message})", path=path,
                            hint="train the teacher first (fmnist-record's: vitkit train -r fmnist-teacher --out "
                                 "runs/fmnist-teacher) or set distill.teacher=RUN/model") from None
    k = model.config.num_classes
    if k != len(classes):
        raise ConfigError(f"distill.teacher {path} predicts {k} classes but the training data has {len(classes)}: "
                          f"the teacher must be trained on the same classes")
    labels = model.meta.labels
    if labels and [str(v) for v in labels] != [str(v) for v in classes]:
        diff = next(i for i, (a, b) in enumerate(zip(labels, classes)) if str(a) != str(b))
        raise ConfigError(f"distill.teacher {path} has other classes or another order than the training data "
                          f"(class {diff}: teacher {labels[diff]!r}, data {classes[diff]!r})")
    return model.eval().requires_grad_(False), dict(model.meta.preprocessing or {})


class Teacher:
    """A loaded, frozen teacher with its preprocessing (mean / std, resolution)."""

    def __init__(self, source: str, classes: List[str], device: torch.device, num_heads: Optional[int] = None):
        model, pre = load_teacher(source, classes, num_heads=num_heads)
        self.source, self.model, self.preprocessing = str(source), model.to(device), pre
        cfg = model.config
        self.normalize = Normalize(pre.get("mean", [0.5]), pre.get("std", [0.5]), channels=cfg.in_chans)
        self.size = tuple(pre.get("size") or cfg.img_size)


class Distillation(Classification):
    """The distillation objective (the recipe's ``distill`` section names the teacher): classification whose
    loss mixes in a teacher's predictions; a student with a distillation token trains inside
    :class:`TwoHeads`. The teacher is loaded when the step is made (after the student is built)."""

    name = "distillation"

    def __init__(self, cfg: DistillConfig):
        self.cfg = cfg
        self.teacher: Optional[Teacher] = None

    def wrap(self, vit: nn.Module, recipe) -> nn.Module:
        return TwoHeads(vit) if getattr(vit, "head_dist", None) is not None else vit

    def export(self, module: nn.Module) -> nn.Module:
        m = unwrap(module)
        return m.vit if isinstance(m, TwoHeads) else m

    def readout(self, module: nn.Module) -> nn.Module:
        """The student as it predicts (the mean of its two heads with a distillation token)."""
        m = unwrap(module)
        return m.vit if isinstance(m, TwoHeads) else module

    def make_step(self, run: RunSetup, state: RunState) -> DistillStep:
        """The student's batch goes to the teacher in the teacher's preprocessing."""
        c = self.cfg
        self.teacher = Teacher(c.teacher, run.data.classes, run.device, c.num_heads)
        feed = TeacherInput(run.normalize, run.config.img_size, self.teacher.normalize, self.teacher.size)
        return DistillStep(run.forward_model, state.optimizer, teacher=self.teacher.model, teacher_input=feed,
                           kind=c.kind, alpha=c.alpha, tau=c.tau, scaler=state.scaler, **step_options(run))

    def results(self, run: RunSetup, evaluator: Evaluator) -> Dict[str, Any]:
        """results.json's teacher entries: its source and, with a test split, its accuracy on the same images
        in its own preprocessing (the pipeline of ``vitkit eval``)."""
        t, test = self.teacher, run.data.test
        out: Dict[str, Any] = {"teacher": t.source}
        if test is not None:
            tf = transform_for(t.preprocessing, t.model.config, test)
            out["teacher_test_top1"] = dataclasses.replace(evaluator, transform=tf)(t.model, test)["top1"]
        return out
