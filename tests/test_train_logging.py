"""train.log: the metrics lines also as TensorBoard scalars (read back from the event files) and as
metrics.csv, equal to metrics.jsonl, also after a stop and --resume; unknown names and a missing
TensorBoard are refused at set-up."""
import csv
import json
import sys

import pytest

from _synthetic import write_npz, write_recipe
from vitkit.errors import ConfigError, MissingDependency
from vitkit.train import Trainer, load_recipe
from vitkit.train.runlog import read_metrics

pytest.importorskip("tensorboard")  # the test extra installs it
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# 2 epochs of 16 steps; a line every 2 steps, an evaluation every 4, a checkpoint every 8
LOGGED = {"train.log": ["tensorboard", "csv"], "schedule.epochs": 2, "train.log_every": 2,
          "train.eval_every": 0.25, "train.ckpt_every": 8, "train.predictions": 0}
NOT_SCALARS = ("step", "epoch", "time", "train_time")


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("logging")
    return write_recipe(d, write_npz(d / "quadrants.npz"))


@pytest.fixture(scope="module")
def full_run(recipe_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "run"
    Trainer(load_recipe(recipe_file, LOGGED), out, progress=False).fit()
    return out


def expected_scalars(rows):
    """{tag: [(step, value)]} as the metrics lines say: PREFIX/KEY for every number of a line."""
    out = {}
    for r in rows:
        prefix = "train" if r["kind"] == "train" else r["split"]
        for k, v in r.items():
            if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(f"{prefix}/{k}", []).append((r["step"], v))
    return out


def read_events(run):
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_tensorboard(run, rows):
    want, got = expected_scalars(rows), read_events(run)
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        steps = [s for s, _ in got[tag]]
        assert steps == [s for s, _ in points], tag
        assert len(set(steps)) == len(steps), tag  # no step twice
        for (_, value), (_, logged) in zip(got[tag], points):
            assert value == pytest.approx(logged, rel=1e-6, abs=1e-12), tag  # event files hold float32


def check_csv(run, rows):
    with open(run / "metrics.csv", newline="") as f:
        table = list(csv.reader(f))
    header, body = table[0], table[1:]
    columns = list(dict.fromkeys(k for r in rows for k in r))  # the union of the keys, first seen first
    assert header == columns
    assert len(body) == len(rows)
    for cells, r in zip(body, rows):
        for k, cell in zip(header, cells):
            if k not in r:
                assert cell == ""
            elif isinstance(r[k], str):
                assert cell == r[k]
            else:
                assert json.loads(cell) == r[k], (k, cell, r[k])


def test_scalars_and_table_equal_the_metrics_lines(full_run):
    rows = read_metrics(full_run)
    kinds = [r["kind"] for r in rows]
    assert kinds.count("train") == 16 and kinds.count("eval") == 8 and kinds.count("test") == 1
    check_tensorboard(full_run, rows)
    tags = set(read_events(full_run))
    for tag in ("train/loss", "train/acc", "train/lr", "train/img_per_s", "val/top1", "val/top1_ema", "test/top1"):
        assert tag in tags, tag
    check_csv(full_run, rows)


def test_stop_and_resume_leave_each_line_once(recipe_file, full_run, tmp_path):
    out = tmp_path / "run"
    recipe = load_recipe(recipe_file, LOGGED)
    # stopped as if killed at step 14: the last checkpoint is at step 8 (a train and an eval line at that
    # step are in it); the lines of steps 10-14 and the evaluation at 12 were written after it
    assert Trainer(recipe, out, progress=False, stop_after=14).fit() == {"stopped_at": 14}
    assert max(r["step"] for r in read_metrics(out)) == 14
    assert max(s for points in read_events(out).values() for s, _ in points) == 14
    Trainer(recipe, out, resume=True, progress=False).fit()
    rows = read_metrics(out)
    where = [(r["kind"], r["step"]) for r in rows]
    assert len(set(where)) == len(where)  # each (kind, step) once
    assert where == [(r["kind"], r["step"]) for r in read_metrics(full_run)]
    check_tensorboard(out, rows)
    check_csv(out, rows)
    # exact resume: the same numbers as the uninterrupted run
    full = expected_scalars(read_metrics(full_run))
    got = read_events(out)
    for tag in ("train/loss", "val/top1", "test/top1"):
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in full[tag]], rel=1e-6)


def test_unknown_logger_is_refused_naming_the_key(recipe_file):
    with pytest.raises(ConfigError, match=r"train\.log.*'neptune'.*tensorboard.*csv.*wandb.*mlflow"):
        load_recipe(recipe_file, {"train.log": ["csv", "neptune"]})
    assert load_recipe(recipe_file).train.log == []  # default: metrics.jsonl alone


def test_missing_tensorboard_fails_at_set_up_with_the_install_line(recipe_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(MissingDependency) as err:
        Trainer(load_recipe(recipe_file, LOGGED), tmp_path / "run", progress=False)
    msg = str(err.value)
    assert "train.log" in msg and "pip install 'vitkit[log]'" in msg and "\n" not in msg
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_csv_alone_writes_no_event_files(recipe_file, tmp_path):
    recipe = load_recipe(recipe_file, {**LOGGED, "train.log": ["csv"], "schedule.steps": 8,
                                       "train.eval_every": 0})
    Trainer(recipe, tmp_path / "run", progress=False).fit()
    assert not (tmp_path / "run" / "tensorboard").exists()
    check_csv(tmp_path / "run", read_metrics(tmp_path / "run"))


def test_a_list_of_words_can_be_given_with_set():
    from vitkit.cli._util import parse_overrides
    from vitkit.train import load_recipe

    ov = parse_overrides(["train.log=[tensorboard,csv]", "optim.betas=[0.9,0.95]", "name=[x"])
    assert ov == {"train.log": ["tensorboard", "csv"], "optim.betas": [0.9, 0.95], "name": "[x"}
    assert load_recipe("fmnist-demo", {"train.log": ov["train.log"]}).train.log == ["tensorboard", "csv"]


# --- experiment trackers: Weights & Biases (offline) and MLflow (file store) ---------------------------
def wandb_records(path):
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte header, then 32 KiB blocks of chunks
    with a 7-byte header each: CRC-32, length, type full / first / middle / last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk


def read_wandb(run):
    """{tag: [(step, value)]} from the offline W&B run's .wandb file (its history records)."""
    from wandb.proto import wandb_internal_pb2
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert files, "no offline W&B run written"
    out = {}
    for f in files:
        for data in wandb_records(f):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") != "history":
                continue
            step = rec.history.step.num
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    out.setdefault(key, []).append((step, json.loads(item.value_json)))
    return out


def read_mlflow(run):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    run_id = (run / "mlflow_run_id").read_text().strip()
    info = client.get_run(run_id)
    hist = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in info.data.metrics}
    return info, hist


def check_points(got, rows, dedupe):
    want = expected_scalars(rows)
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        pts = sorted(got[tag]) if not dedupe else sorted(dict(got[tag]).items())
        assert [s for s, _ in pts] == [s for s, _ in points], tag
        assert [v for _, v in pts] == pytest.approx([v for _, v in points], rel=1e-6), tag


@pytest.fixture
def trackers(monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return {**LOGGED, "train.log": ["wandb", "mlflow"], "schedule.epochs": 1}


def test_wandb_and_mlflow_runs_hold_the_metrics_lines(recipe_file, tmp_path, trackers):
    out = tmp_path / "run"
    Trainer(load_recipe(recipe_file, trackers), out, progress=False).fit()
    rows = read_metrics(out)
    check_points(read_wandb(out), rows, dedupe=False)
    info, hist = read_mlflow(out)
    check_points(hist, rows, dedupe=False)
    assert info.info.status == "FINISHED" and info.data.params["optim.name"] == "adamw"


def test_trackers_continue_their_run_on_resume(recipe_file, tmp_path, trackers):
    """A stop and --resume: one W&B run and one MLflow run, every step's numbers those of metrics.jsonl."""
    out = tmp_path / "run"
    recipe = load_recipe(recipe_file, trackers)
    Trainer(recipe, out, progress=False, stop_after=10).fit()  # checkpoint at step 8
    wandb_id, mlflow_id = (out / "wandb" / "run_id").read_text(), (out / "mlflow_run_id").read_text()
    Trainer(recipe, out, resume=True, progress=False).fit()
    assert (out / "wandb" / "run_id").read_text() == wandb_id and (out / "mlflow_run_id").read_text() == mlflow_id
    rows = read_metrics(out)
    check_points(read_wandb(out), rows, dedupe=True)  # W&B: the first value of a step
    _, hist = read_mlflow(out)
    check_points(hist, rows, dedupe=True)  # MLflow: the lines after the checkpoint twice, the same numbers


def test_missing_tracker_fails_at_set_up_with_the_install_line(recipe_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(MissingDependency, match=r"mlflow is not installed.*pip install 'vitkit\[mlflow\]'"):
        Trainer(load_recipe(recipe_file, {**LOGGED, "train.log": ["mlflow"]}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # checked before the data is read or the run folder made
