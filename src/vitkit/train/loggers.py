"""Optional copies of the metrics lines: TensorBoard event files, a CSV table, Weights & Biases and MLflow
runs (``train.log``).

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

- ``wandb``: a Weights & Biases run in ``RUN/wandb``, offline unless ``WANDB_MODE`` says otherwise (``wandb
  sync RUN/wandb/offline-run-*`` uploads it later); the same ``PREFIX/KEY`` scalars at the line's step, the
  recipe as the run's config. Its id is kept in ``RUN/wandb/run_id``, so ``--resume`` continues the same
  run; W&B keeps the first value it got for a step, so the lines a killed part wrote after its checkpoint
  stay as they were (they are the same numbers again in an exact resume).
- ``mlflow``: an MLflow run in a file store, ``RUN/mlruns`` unless ``MLFLOW_TRACKING_URI`` names another
  store (MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true`` for file stores: set when it is not), experiment
  ``vitkit``; metrics ``PREFIX/KEY`` at the line's step, the recipe's fields as parameters. Its id is kept
  in ``RUN/mlflow_run_id``; a resumed run continues it and logs the lines after its checkpoint again
  (MLflow keeps each metric's whole history).

TensorBoard, W&B and MLflow are optional dependencies (``pip install 'vitkit[log]'``, ``'vitkit[wandb]'``,
``'vitkit[mlflow]'``); a recipe that asks for one without it installed fails at set-up.
"""
from __future__ import annotations

import csv
import io
import json
import numbers
import os
import secrets
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from ..errors import ConfigError, MissingDependency
from ..utils import atomic_path

LOGGERS = ("tensorboard", "csv", "wandb", "mlflow")  # the names train.log accepts
# what each optional logger imports, and the extra that installs it
LOGGER_PACKAGES = {"tensorboard": ("torch.utils.tensorboard", "log"), "wandb": ("wandb", "wandb"),
                   "mlflow": ("mlflow", "mlflow")}
_NOT_SCALARS = ("step", "epoch", "time", "train_time")  # where and when a line is, not what it measured


def check_loggers(names: Iterable[str]) -> None:
    """ConfigError naming ``train.log`` for an unknown name; MissingDependency naming the extra for an
    optional logger that is not installed."""
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"unknown logger {name!r}", key="train.log", hint=f"use {' and/or '.join(LOGGERS)}")
    import importlib
    for name in dict.fromkeys(names):
        if name not in LOGGER_PACKAGES:
            continue
        module, extra = LOGGER_PACKAGES[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingDependency(f"{name} is not installed", extra=extra, key="train.log",
                                    hint=f"pip install 'vitkit[{extra}]' (or drop {name} from train.log)") from None


def open_loggers(names: Sequence[str], run_dir: Path, rows: List[Dict[str, Any]],
                 resume_step: Optional[int], config: Optional[Dict[str, Any]] = None) -> list:
    """The loggers ``names`` for the run folder ``run_dir``. ``rows``: the lines metrics.jsonl holds
    (those a resumed run kept; none for a new run); ``resume_step``: the checkpoint's step (None: a new run);
    ``config``: the recipe, for the experiment trackers."""
    check_loggers(names)
    out = []
    for name in dict.fromkeys(names):
        if name == "csv":
            out.append(CsvLog(run_dir / "metrics.csv", rows))
        elif name == "tensorboard":
            out.append(TensorBoardLog(run_dir / "tensorboard", rows, resume_step))
        elif name == "wandb":
            out.append(WandbLog(run_dir, rows, resume_step, config or {}))
        elif name == "mlflow":
            out.append(MlflowLog(run_dir, rows, resume_step, config or {}))
    return out


def scalars(record: Dict[str, Any]) -> Dict[str, float]:
    """The numbers of a metrics line as ``PREFIX/KEY`` (``train/loss``, ``val/top1``): the prefix is ``train``
    for train lines, the split for evaluation and test lines."""
    prefix = "train" if record.get("kind") in ("train", "diverged") else record.get("split") or record.get("kind")
    return {f"{prefix}/{k}": float(v) for k, v in record.items()
            if k not in _NOT_SCALARS and not isinstance(v, bool) and isinstance(v, numbers.Real)}


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _run_id(path: Path, make) -> tuple:
    """(the id kept in ``path``, whether it was there): a resumed run continues its tracker run."""
    if path.is_file():
        return path.read_text().strip(), True
    run_id = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(run_id)
    return run_id, False


class WandbLog:
    """The metrics lines into a Weights & Biases run (offline by default) in ``RUN/wandb``."""

    def __init__(self, run_dir: Path, rows: List[Dict[str, Any]], resume_step: Optional[int], config: Dict[str, Any]):
        import wandb

        folder = run_dir / "wandb"
        if resume_step is None and (folder / "run_id").is_file():
            (folder / "run_id").unlink()  # a new run in a folder an earlier one left: a new W&B run
        run_id, known = _run_id(folder / "run_id", lambda: secrets.token_hex(4))
        self.run = wandb.init(dir=str(run_dir), id=run_id, resume="allow", mode=os.environ.get("WANDB_MODE", "offline"),
                              project=os.environ.get("WANDB_PROJECT", "vitkit"), name=run_dir.name, config=config,
                              reinit="create_new", settings=wandb.Settings(silent=True, console="off"))
        self.last = max((r.get("step", -1) for r in rows), default=-1) if known else -1
        for row in rows:
            self.write(row)

    def write(self, record: Dict[str, Any]) -> None:
        step = record.get("step")
        if step is None or step < self.last:  # W&B keeps the first value of a step
            return
        self.last = step
        self.run.log(scalars(record), step=int(step))

    def close(self) -> None:
        self.run.finish()


class MlflowLog:
    """The metrics lines into an MLflow run (file store ``RUN/mlruns`` by default)."""

    def __init__(self, run_dir: Path, rows: List[Dict[str, Any]], resume_step: Optional[int], config: Dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the run folder's file store; MLflow 3 asks for this opt-in to its file backend
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / "mlflow_run_id"
        if resume_step is None and id_file.is_file():
            id_file.unlink()

        def new_run() -> str:
            exp = self.client.get_experiment_by_name("vitkit")
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment("vitkit")
            run = self.client.create_run(exp_id, run_name=run_dir.name)
            params = {k: str(v)[:500] for k, v in _flat(config).items()}
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
                from mlflow.entities import Param
                self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in list(params.items())[i:i + 100]])
            return run.info.run_id

        self.run_id, known = _run_id(id_file, new_run)
        if known:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            for row in rows:
                self.write(row)

    def write(self, record: Dict[str, Any]) -> None:
        import time as _time

        from mlflow.entities import Metric
        step = record.get("step")
        if step is None:
            return
        now = int(_time.time() * 1000)
        metrics = [Metric(k, v, now, int(step)) for k, v in scalars(record).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


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
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=int(step))
        if flush:
            self.writer.flush()  # each line is on disk when the next step starts (a kill loses nothing)

    def close(self) -> None:
        self.writer.close()
