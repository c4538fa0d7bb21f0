"""Optional copies of the metrics lines: TensorBoard event files and a CSV table (``train.log``).

``RUN/metrics.jsonl`` stays the record of a run; a recipe's ``train.log: [tensorboard, csv]`` sends every
line it gets to these as well (:class:`vitkit.train.runlog.MetricsLog` calls :func:`open_loggers` and then
each logger's ``write``):

- ``tensorboard``: ``RUN/tensorboard/events.out.tfevents.*`` through torch's ``SummaryWriter``; every
  number of a line is a scalar tagged ``PREFIX/KEY`` (``train/loss``, ``val/top1_ema``, ``test/top1``:
  the prefix is ``train`` for train lines and the split for eval / test lines) at the line's step.
  A resumed run opens the writer with ``purge_step`` at the checkpoint's step, so TensorBoard drops the
  events a killed part wrote after it, and writes again the kept lines of that step.
- ``csv``: ``RUN/metrics.csv``, one row per line of metrics.jsonl, the columns the union of the lines'
  keys in the order they first appear. It is a function of metrics.jsonl: a resumed run rewrites it from
  the lines metrics.jsonl kept, so a kill and ``--resume`` leave one row per line here too.

TensorBoard is an optional dependency (``pip install 'vitkit[log]'``); a recipe that asks for it without
it installed fails at set-up.
"""
from __future__ import annotations

import csv
import io
import json
import numbers
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ..errors import ConfigError, MissingDependency
from ..utils import atomic_path

LOGGERS = ("tensorboard", "csv")  # the names train.log accepts
_NOT_SCALARS = ("step", "epoch", "time", "train_time")  # where and when a line is, not what it measured


def check_loggers(names: Iterable[str]) -> None:
    """ConfigError naming ``train.log`` for an unknown name; MissingDependency (the ``log`` extra) for
    ``tensorboard`` when it is not installed."""
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"unknown logger {name!r}", key="train.log", hint=f"use {' and/or '.join(LOGGERS)}")
    if "tensorboard" in names:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise MissingDependency("tensorboard is not installed", extra="log", key="train.log",
                                    hint="pip install 'vitkit[log]' (or drop tensorboard from train.log)") from None


def open_loggers(names: Sequence[str], run_dir: Path, rows: List[Dict[str, Any]],
                 resume_step: Optional[int]) -> list:
    """The loggers ``names`` for the run folder ``run_dir``. ``rows``: the lines metrics.jsonl holds
    (those a resumed run kept; none for a new run); ``resume_step``: the checkpoint's step (None: a new run)."""
    check_loggers(names)
    out = []
    for name in dict.fromkeys(names):
        if name == "csv":
            out.append(CsvLog(run_dir / "metrics.csv", rows))
        elif name == "tensorboard":
            out.append(TensorBoardLog(run_dir / "tensorboard", rows, resume_step))
    return out


class CsvLog:
    """``metrics.csv``: appended row by row while the columns stay the same, rewritten (atomically) when a
    line brings a new key, and rewritten from ``rows`` when opened."""

    def __init__(self, path: Path, rows: List[Dict[str, Any]]):
        self.path, self.rows, self.columns = path, [], []
        for row in rows:
            self._add(row)
        if self.rows:
            self._rewrite()
        elif path.exists():
            path.unlink()  # a new run: nothing of an earlier one

    def _add(self, row: Dict[str, Any]) -> bool:
        new = [k for k in row if k not in self.columns]
        self.columns += new
        self.rows.append(row)
        return bool(new)

    def _line(self, row: Dict[str, Any]) -> str:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([_cell(row.get(k)) for k in self.columns])
        return buf.getvalue()

    def _rewrite(self) -> None:
        with atomic_path(self.path) as tmp:
            with open(tmp, "w", newline="") as f:
                csv.writer(f, lineterminator="\n").writerow(self.columns)
                f.writelines(self._line(r) for r in self.rows)

    def write(self, record: Dict[str, Any]) -> None:
        if self._add(record) or not self.path.exists():
            self._rewrite()
            return
        with open(self.path, "a", newline="") as f:
            f.write(self._line(record))
            f.flush()
            os.fsync(f.fileno())


def _cell(v: Any) -> str:
    """A value as metrics.jsonl spells it (numbers, true / false), strings as they are, nothing for None."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return json.dumps(v)


class TensorBoardLog:
    """Scalars of every line into ``RUN/tensorboard`` with the line's step as the global step."""

    def __init__(self, folder: Path, rows: List[Dict[str, Any]], resume_step: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter

        old = sorted(folder.glob("events.out.tfevents.*")) if folder.is_dir() else []
        if resume_step is None:
            for f in old:  # a new run in a folder an earlier, unfinished run left
                f.unlink()
            replay: List[Dict[str, Any]] = []
            self.writer = SummaryWriter(log_dir=str(folder))
        else:
            # TensorBoard discards the events at steps >= purge_step written before; the kept lines of the
            # checkpoint's own step are written again (all kept lines if there were no event files yet)
            replay = [r for r in rows if not old or r.get("step", 0) >= resume_step]
            self.writer = SummaryWriter(log_dir=str(folder), purge_step=resume_step)
        for row in replay:
            self.write(row, flush=False)
        self.writer.flush()

    def write(self, record: Dict[str, Any], flush: bool = True) -> None:
        step = record.get("step")
        if step is None:
            return
        prefix = "train" if record.get("kind") in ("train", "diverged") else record.get("split") or record.get("kind")
        for key, value in record.items():
            if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, numbers.Real):
                continue
            self.writer.add_scalar(f"{prefix}/{key}", float(value), global_step=int(step))
        if flush:
            self.writer.flush()  # each line is on disk when the next step starts (a kill loses nothing)

    def close(self) -> None:
        self.writer.close()
