"""A real training process killed at the worst moments, then resumed: nothing is lost, nothing doubles.

One run of the tiny synthetic recipe is SIGKILLed four times in a row (in the middle of a metrics line,
inside a checkpoint write, right after the final checkpoint, after the final evaluation was logged but
before the model was exported) and resumed with ``--resume`` after each kill. The kill points are
placed exactly by a small harness that wraps vitkit's own functions in the child process (the product
has no switch for this). At the end the run folder must equal an uninterrupted run's: one metrics line
per step with the same values, bit-identical weights, the same results, and no temporary files.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from _synthetic import write_npz, write_recipe

pytestmark = pytest.mark.slow

SRC = str(Path(vitkit.__file__).resolve().parents[1])
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))

# Runs `vitkit ARGS` in this process after arranging a SIGKILL at one point of the run.
HARNESS = r'''
import io, os, signal, sys
import torch
import vitkit.train.checkpoint as checkpoint
import vitkit.train.report as report
import vitkit.train.runlog as runlog
from vitkit.cli import main

mode, at, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
calls = []

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "in-metrics-write":  # the at-th metrics line is cut in half by the kill
    real_write = runlog.MetricsLog.write
    def write(self, record):
        calls.append(1)
        if len(calls) == at:
            import json
            with open(self.path, "a") as f:
                line = json.dumps(record)
                f.write(line[: len(line) // 2])
            die()
        real_write(self, record)
    runlog.MetricsLog.write = write
elif mode == "in-checkpoint-write":  # the at-th checkpoint: half its bytes are in the temp file
    real_save = torch.save
    def save(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == at:
            buf = io.BytesIO()
            real_save(obj, buf, *a, **kw)
            with open(f, "wb") as out:
                out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                out.flush()
                os.fsync(out.fileno())
            die()
        real_save(obj, f, *a, **kw)
    torch.save = save
elif mode == "after-final-checkpoint":
    real_state = checkpoint.save_state
    def save_state(path, state):
        out = real_state(path, state)
        if state["step"] >= state["total_steps"]:
            die()
        return out
    checkpoint.save_state = save_state
elif mode == "before-export":  # the final evaluations are logged; the model is not written yet
    def save_model(*a, **kw):
        die()
    report.save_model = save_model
else:
    raise SystemExit("unknown mode " + mode)
sys.exit(main(argv))
'''


def _train(recipe, out, *extra, harness=None):
    cmd = [sys.executable, "-m", "vitkit"] if harness is None else [sys.executable, "-c", HARNESS, *harness]
    return subprocess.run(cmd + ["train", "-r", str(recipe), "--out", str(out), "--no-progress", *extra],
                          capture_output=True, text=True, env=ENV, timeout=300)


def _rows(run):
    """metrics.jsonl as comparable records (wall times left out)."""
    keep = ("kind", "split", "step", "final", "weights", "loss", "acc", "lr", "top1", "top1_ema", "top5")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, lines)]


def _temps(run):
    return sorted(str(p.relative_to(run)) for p in run.rglob("*.tmp"))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    data = write_npz(d / "quadrants.npz", n_train=320, n_test=64)  # 64 held out: 8 steps per epoch
    recipe = write_recipe(d, data)
    text = recipe.read_text().replace("epochs: 6", "epochs: 4")  # 32 steps: evaluations at 8, 16, 24, 32
    recipe.write_text(text)
    ref = d / "reference"
    r = _train(recipe, ref)
    assert r.returncode == 0, r.stderr
    return d, recipe, ref


def test_four_kills_and_resumes_leave_the_run_an_uninterrupted_run_would(task):
    d, recipe, ref = task
    run = d / "killed"
    ref_rows = _rows(ref)
    assert sum(1 for r in ref_rows if r.get("final")) == 1
    assert len({(r["kind"], r["step"]) for r in ref_rows}) == len(ref_rows)  # one line per kind and step

    kills = [("in-metrics-write", 6, False),  # the 6th line (train 4, 8, eval 8, train 12, 16, eval 16) is cut
             ("in-checkpoint-write", 3, True),  # the 3rd checkpoint this process writes
             ("after-final-checkpoint", 0, True),
             ("before-export", 0, True)]
    for mode, at, resume in kills:
        r = _train(recipe, run, *(["--resume"] if resume else []), harness=[mode, str(at)])
        assert r.returncode == -signal.SIGKILL, (mode, r.returncode, r.stderr[-2000:])
        assert not (run / "results.json").exists()
        if mode == "in-metrics-write":
            assert not (run / "metrics.jsonl").read_text().endswith("\n")  # a line was cut by the kill
        if mode == "in-checkpoint-write":
            assert [t for t in _temps(run) if t.startswith("checkpoints/.last.pt.")], _temps(run)
        if mode == "before-export":  # the final validation and the test line were logged before the kill
            assert _rows(run)[-2].get("final") and _rows(run)[-1]["kind"] == "test"
    r = _train(recipe, run, "--resume")
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout

    assert _rows(run) == ref_rows  # exactly one line per step, with the uninterrupted run's values
    assert _temps(run) == []
    a = load_file(str(ref / "model" / "model.safetensors"))
    b = load_file(str(run / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(ref / "checkpoints" / "last.pt", weights_only=True)
    sb = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert sa["step"] == sb["step"] and all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    ra, rb = (json.loads((p / "results.json").read_text()) for p in (ref, run))
    assert ra["test_top1"] == rb["test_top1"] and ra["val"] == rb["val"]


def test_resuming_a_finished_run_again_changes_nothing(task):
    d, recipe, ref = task
    run = d / "again"
    import shutil
    shutil.copytree(ref, run)
    before = _rows(run)
    r = _train(recipe, run, "--resume")
    assert r.returncode == 0, r.stderr
    assert _rows(run) == before  # the final evaluation is not written twice


def test_metrics_log_resumes_at_the_checkpoints_line_count(tmp_path):
    """The checkpoint's line count decides, not the step: a line written after the checkpoint at the same
    step (here an evaluation) and a line cut off by a kill are both dropped."""
    from vitkit.train.runlog import MetricsLog, read_metrics

    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (4, 8):
        log.write({"kind": "train", "step": step})
    mark = log.rows  # what a checkpoint at step 8 records
    log.write({"kind": "eval", "step": 8})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "st')  # killed mid-line
    resumed = MetricsLog(tmp_path / "metrics.jsonl", truncate_after_step=8, resume_rows=mark)
    assert resumed.rows == 2 and read_metrics(tmp_path) == [{"kind": "train", "step": 4}, {"kind": "train", "step": 8}]
    resumed.write({"kind": "eval", "step": 8})
    assert [r["kind"] for r in read_metrics(tmp_path)] == ["train", "train", "eval"]
