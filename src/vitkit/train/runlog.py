"""The run folder's records: metrics as JSON lines and the curves as a PNG.

``RUN/metrics.jsonl`` gets one line per log interval (``kind: train``) and per evaluation
(``kind: eval``), each with step, epoch and wall time; :func:`plot_curves` draws loss, accuracy and
learning rate from it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..utils import PathLike, atomic_path
from .loggers import check_loggers, open_loggers


class MetricsLog:
    """``metrics.jsonl``, appended one fsync'ed line at a time, and exact after a crash.

    :attr:`rows` counts the lines written so far; a training checkpoint records it. Resuming from that
    checkpoint (``resume_rows``) keeps exactly those lines and drops everything written after it (the
    evaluation a killed run wrote after its last checkpoint, a line cut off by the kill), so a kill at
    any instant followed by ``--resume`` leaves exactly one line per step. Checkpoints older than
    this record are resumed by step: lines up to ``truncate_after_step``, less any final evaluation.

    ``loggers`` (the recipe's ``train.log``): each line also goes to TensorBoard, metrics.csv, W&B and / or
    MLflow (:mod:`vitkit.train.loggers`; ``config``: the recipe, for the trackers), which start from the
    lines kept here.
    """

    def __init__(self, path: PathLike, enabled: bool = True, truncate_after_step: Optional[int] = None,
                 resume_rows: Optional[int] = None, loggers: Sequence[str] = (),
                 config: Optional[Dict[str, Any]] = None):
        self.path, self.enabled, self.rows = Path(path), enabled, 0
        self.loggers: list = []
        check_loggers(loggers)  # on every process, so that none goes on alone
        resuming = truncate_after_step is not None or resume_rows is not None
        keep: List[str] = []
        if enabled and resuming and self.path.is_file():
            lines = _complete_lines(self.path)
            if resume_rows is not None:
                keep = lines[:int(resume_rows)]
            else:
                keep = [line for line in lines if json.loads(line).get("step", 0) <= truncate_after_step
                        and not json.loads(line).get("final")]
            with atomic_path(self.path) as tmp:
                tmp.write_text("".join(k + "\n" for k in keep))
            self.rows = len(keep)
        if enabled and loggers:
            rows = [json.loads(k) for k in keep]
            step = truncate_after_step if truncate_after_step is not None else (
                max((r.get("step", 0) for r in rows), default=0) if resuming else None)
            self.loggers = open_loggers(loggers, self.path.parent, rows, step, config)

    def write(self, record: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows += 1
        for logger in self.loggers:
            logger.write(record)

    def close(self) -> None:
        """End the trackers' runs (W&B's finish, MLflow's terminated status)."""
        for logger in self.loggers:
            if hasattr(logger, "close"):
                logger.close()
        self.loggers = []


def _complete_lines(path: Path) -> List[str]:
    """The lines of a JSON-lines file that are whole records (a line cut off by a kill is not)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            if line.strip() and isinstance(json.loads(line), dict):
                out.append(line)
        except json.JSONDecodeError:
            continue
    return out


def read_metrics(path: PathLike) -> List[Dict[str, Any]]:
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    return [json.loads(line) for line in _complete_lines(p)]


def plot_curves(run_dir: PathLike, out: Optional[PathLike] = None, title: Optional[str] = None) -> Optional[Path]:
    """curves.png: training loss, train/eval accuracy and lr against step. None if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    if train:
        axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
        axes[1].plot([r["step"] for r in train], [100 * r["acc"] for r in train], lw=1, label="train (augmented)")
        axes[2].plot([r["step"] for r in train], [r["lr"] for r in train], lw=1)
    for key, style in (("top1", "o-"), ("top1_ema", "s--")):
        pts = [(r["step"], 100 * r[key]) for r in evals if r.get(key) is not None]
        if pts:
            label = f"{evals[-1].get('split', 'eval')} top-1" + (" (EMA)" if key.endswith("ema") else "")
            axes[1].plot(*zip(*pts), style, ms=3, label=label)
    if evals and evals[-1].get("top1") is not None:
        best = max(100 * max(r.get("top1") or 0, r.get("top1_ema") or 0) for r in evals)
        axes[1].set_ylim(max(0, best - 25), min(100, best + 3))
    axes[0].set(xlabel="step", ylabel="training loss", title="loss")
    axes[1].set(xlabel="step", ylabel="accuracy (%)", title="accuracy")
    axes[1].legend(loc="lower right", fontsize=8)
    axes[2].set(xlabel="step", ylabel="learning rate", title="schedule")
    for ax in axes:
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curves.png"
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


def plot_predictions(images, labels, probs, classes, out: PathLike, mean=(0.5,), std=(0.5,)) -> Optional[Path]:
    """A grid of test images with predicted class, confidence and the true class (wrong ones in red)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    n = len(images)
    cols = min(8, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.7 * cols, 2.0 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        img = images[i]
        arr = img.permute(1, 2, 0).numpy()
        ax.imshow(arr[..., 0] if arr.shape[-1] == 1 else arr, cmap="gray" if arr.shape[-1] == 1 else None)
        p, c = float(probs[i].max()), int(probs[i].argmax())
        ok = c == int(labels[i])
        ax.set_title(f"{classes[c]} {100 * p:.0f}%" + ("" if ok else f"\n(true: {classes[int(labels[i])]})"),
                     fontsize=7, color="black" if ok else "red")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return Path(out)
