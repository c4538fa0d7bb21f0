"""The run state and its checkpoints: everything needed to continue a run exactly, written atomically.

:class:`RunState` is what a run changes as it trains. ``RUN/checkpoints/last.pt`` holds all of it: the
model, optimiser, EMA, fp16 loss scale, step, epoch, position in the epoch, training time and the RNG
states. It is replaced atomically (temp file + rename), so a crash mid-write leaves the previous one intact.
It loads with ``torch.load(weights_only=True)``: no code runs from it. The trained model itself is exported
in vitkit's format (``RUN/model/``) at the end.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, NotFoundError
from ..utils import PathLike, atomic_path
from . import distributed as D
from .optim import EMA, set_lr

FORMAT = "vitkit-train-state"
VERSION = 1


def rng_state() -> Dict[str, Any]:
    out = {"torch": torch.get_rng_state(), "python": _py_state()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(d: Dict[str, Any]) -> None:
    torch.set_rng_state(d["torch"])
    st = d.get("python")
    if st is not None:
        random.setstate((int(st[0]), tuple(int(v) for v in st[1].tolist()), None))
    if "cuda" in d and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(d["cuda"])


def _py_state():
    version, internal, _ = random.getstate()
    return [version, torch.tensor(internal, dtype=torch.int64)]


def save_state(path: PathLike, state: Dict[str, Any]) -> Path:
    path = Path(path)
    state = dict(state, format=FORMAT, version=VERSION)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def load_state(path: PathLike) -> Dict[str, Any]:
    from ..checkpoints.files import read_torch

    path = Path(path)
    if not path.is_file():
        raise NotFoundError("no training checkpoint here: nothing to resume", path=path,
                            hint="start the run without --resume")
    try:
        state = read_torch(path)  # weights_only: a damaged file is reported as such, a hostile one refused
    except CheckpointError as err:
        err.hint = "the training checkpoint is damaged: start the run again (in a new --out folder)"
        raise
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError("not a vitkit training checkpoint", path=path)
    if int(state.get("version", 0)) > VERSION:
        raise CheckpointError(f"written by a newer vitkit (version {state['version']})", path=path,
                              hint="upgrade vitkit")
    return state


def find_last(run_dir: PathLike) -> Optional[Path]:
    p = Path(run_dir) / "checkpoints" / "last.pt"
    return p if p.is_file() else None


class RunState:
    """Everything a run changes as it trains, and nothing else: the weights (``model``, the trained module),
    the optimiser, the EMA of the weights, the fp16 gradient scaler, the step count (which fixes the data
    position: epoch and batch, as the epoch order is a function of (seed, epoch)), the training time and the
    RNG states. This class is the only writer of it: the loop opens each step with :meth:`begin_step` (the
    schedule's lr, the step's noise seed) and reports it finished with :meth:`end_step`; the step function
    (:class:`~vitkit.train.step.TrainStep`) updates the weights and optimiser moments it was given;
    :meth:`save` and :meth:`restore` write and read all of it, whole, so a resumed run continues exactly (the
    loss scale of an fp16 run included)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, ema: Optional[EMA] = None,
                 scaler: Optional[torch.amp.GradScaler] = None, steps_per_epoch: int, total_steps: int):
        self.model, self.optimizer, self.ema, self.scaler = model, optimizer, ema, scaler
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.step = 0
        self.trained_s = 0.0  # training time so far (evaluations and checkpoints excluded), kept on resume
        self.metrics_rows: Optional[int] = None  # metrics.jsonl lines the restored checkpoint had seen

    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, batch within the epoch) of the next step."""
        return divmod(self.step, self.steps_per_epoch)

    def begin_step(self, lr: float, noise_seed: int) -> None:
        """Before an optimiser step: the schedule's ``lr`` into the optimiser (times each group's layer-wise
        scale) and the global RNG (dropout, stochastic depth) seeded with ``noise_seed``."""
        set_lr(self.optimizer, lr)
        torch.manual_seed(noise_seed)

    def end_step(self, trained_s: float, averaged: nn.Module) -> None:
        """One optimiser step is done: the training time is now ``trained_s`` (agreed by all processes), the
        EMA moves towards ``averaged`` (the plain module), the step is counted."""
        self.trained_s = trained_s
        if self.ema is not None:
            self.ema.update(averaged)
        self.step += 1

    def state_dict(self, metrics_rows: Optional[int] = None, **about: Any) -> Dict[str, Any]:
        """The whole state as a checkpoint dict (collective under FSDP); ``about``: what the run was (recipe,
        classes, model config), stored beside it."""
        model_state, optim_state = D.full_state(self.model, self.optimizer)
        epoch, batch = self.position
        st = {"step": self.step, "epoch": epoch, "batch": batch, "model": model_state, "optimizer": optim_state,
              "rng": rng_state(), "total_steps": self.total_steps, "trained_s": self.trained_s,
              "metrics_rows": metrics_rows, **about}
        if self.ema is not None:
            ema = self.ema.state_dict()
            ema["shadow"] = {k: D.full_tensor(v) for k, v in ema["shadow"].items()}
            st["ema"] = ema
        if self.scaler is not None:  # fp16: the loss scale and its growth tracker
            st["grad_scaler"] = self.scaler.state_dict()
        return st

    def load_state_dict(self, st: Dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` gave (a run built from the same recipe)."""
        if st.get("total_steps") not in (None, self.total_steps):
            raise ConfigError(f"the checkpoint belongs to a {st['total_steps']}-step run but the recipe now has "
                              f"{self.total_steps} steps: resume with the same recipe")
        D.load_full_state(self.model, self.optimizer, st["model"], st["optimizer"])
        if self.ema is not None and "ema" in st:
            self.ema.load_state_dict(st["ema"])
        if self.scaler is not None and st.get("grad_scaler"):
            self.scaler.load_state_dict(st["grad_scaler"])
        set_rng_state(st["rng"])
        self.step = int(st["step"])
        self.trained_s = float(st.get("trained_s", 0.0))
        self.metrics_rows = st.get("metrics_rows")

    def save(self, run_dir: PathLike, dist: D.Dist, metrics_rows: Optional[int] = None, **about: Any
             ) -> Optional[Path]:
        """``run_dir``/checkpoints/last.pt (atomic; collective under FSDP); its path on the main process."""
        st = self.state_dict(metrics_rows, **about)
        path = save_state(Path(run_dir) / "checkpoints" / "last.pt", st) if dist.main else None
        D.barrier(dist)
        return path

    def restore(self, path: PathLike) -> None:
        """Continue from the checkpoint at ``path``."""
        self.load_state_dict(load_state(path))


def grad_scaler(precision: str) -> Optional[torch.amp.GradScaler]:
    """The loss scaler of an fp16 run (CUDA): the loss scaled so small gradients stay representable, unscaled
    before clipping; a step whose gradients overflowed is skipped and the scale lowered. None otherwise."""
    return torch.amp.GradScaler("cuda") if precision == "fp16" else None
