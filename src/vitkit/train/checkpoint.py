"""Training checkpoints: everything needed to continue a run exactly, written atomically.

``RUN/checkpoints/last.pt`` holds the model, optimiser, EMA, step, epoch, position in the epoch and
the RNG states; it is replaced atomically (temp file + rename), so a crash mid-write leaves the
previous one intact. It loads with ``torch.load(weights_only=True)``: no code runs from it. The
trained model itself is exported in vitkit's format (``RUN/model/``) at the end.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from ..errors import CheckpointError, ConfigError, NotFoundError
from ..utils import PathLike, atomic_path
from . import distributed as D

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


def trainer_state(tr: Any) -> Dict[str, Any]:
    """What a :class:`~vitkit.train.trainer.Trainer` ``tr`` resumes from exactly: full model and optimiser
    states, EMA, step and position, RNG states, the fp16 loss scale (collective under FSDP)."""
    model_state, optim_state = D.full_state(tr.wrapped, tr.optimizer)
    st = {"step": tr.step, "epoch": tr.step // tr.steps_per_epoch,
          "batch": tr.step % tr.steps_per_epoch, "model": model_state, "optimizer": optim_state,
          "rng": rng_state(), "recipe": tr.recipe.to_dict(), "classes": tr.classes,
          "config": tr.config.to_dict(), "total_steps": tr.total_steps,
          "trained_s": tr.trained_s, "metrics_rows": tr.log.rows if tr.log is not None else None}
    if tr.ema is not None:
        ema = tr.ema.state_dict()
        ema["shadow"] = {k: D.full_tensor(v) for k, v in ema["shadow"].items()}
        st["ema"] = ema
    if getattr(tr.step_fn, "scaler", None) is not None:  # fp16: the loss scale, for an exact resume
        st["grad_scaler"] = tr.step_fn.scaler.state_dict()
    return st


def restore_trainer(tr: Any, st: Dict[str, Any]) -> None:
    """Put the state :func:`trainer_state` saved back into the Trainer ``tr`` (built from the same recipe)."""
    if st.get("total_steps") not in (None, tr.total_steps):
        raise ConfigError(f"the checkpoint belongs to a {st['total_steps']}-step run but the recipe now has "
                          f"{tr.total_steps} steps: resume with the same recipe")
    D.load_full_state(tr.wrapped, tr.optimizer, st["model"], st["optimizer"])
    if tr.ema is not None and "ema" in st:
        tr.ema.load_state_dict(st["ema"])
    set_rng_state(st["rng"])
    tr.step = int(st["step"])
    scaler = getattr(tr.step_fn, "scaler", None)  # the step function exists: the Trainer builds it first
    if scaler is not None and st.get("grad_scaler"):
        scaler.load_state_dict(st["grad_scaler"])
    tr.trained_s = float(st.get("trained_s", 0.0))
    tr.resume_rows = st.get("metrics_rows")
