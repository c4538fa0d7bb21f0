"""The training loop end to end on a small synthetic task: learning, run folder, exact resume after a
kill, NaN detection, fine-tuning from a checkpoint, evaluation from the CLI."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from _synthetic import write_npz, write_recipe
from vitkit.checkpoints import load_weights, save_model
from vitkit.models import VisionTransformer
from vitkit.train import Trainer, TrainingDiverged, load_recipe

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _vitkit(*args, check=True, **kw):
    return subprocess.run([sys.executable, "-m", "vitkit", *map(str, args)], capture_output=True, text=True,
                          env=ENV, check=check, timeout=300, **kw)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("task")
    data = write_npz(d / "quadrants.npz")
    return d, data, write_recipe(d, data)


@pytest.fixture(scope="module")
def full_run(task):
    """An uninterrupted run of the tiny recipe through the CLI (6 epochs, 96 steps)."""
    d, _, recipe = task
    out = d / "full"
    res = _vitkit("train", "-r", recipe, "--out", out, "--no-progress")
    return out, res.stdout


def test_training_learns_and_fills_the_run_folder(task, full_run):
    out, stdout = full_run
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 96 and results["test_top1"] > 0.85  # chance is 0.25
    assert results["train_images"] == 512 and results["val_images"] == 64 and results["test_images"] == 128
    assert "test accuracy:" in stdout
    for name in ("recipe.yaml", "metrics.jsonl", "curves.png", "predictions.png", "checkpoints/last.pt",
                 "model/model.safetensors", "model/vitkit.json"):
        assert (out / name).is_file(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert train[-1]["loss"] < train[0]["loss"]
    assert [r["step"] for r in train] == list(range(4, 97, 4))
    # five periodic evaluations and the final one, all on the validation split; one test line at the end
    assert len(evals) == 6 and evals[-1].get("final") and "top1_ema" in evals[-1]
    assert {r["split"] for r in evals} == {"val"}
    tests = [r for r in rows if r["kind"] == "test"]
    assert len(tests) == 1 and tests[0]["top1"] == results["test_top1"]
    assert tests[0]["weights"] == results["exported_weights"]
    val = results["val"]
    assert results["exported_weights"] == ("raw" if val["raw"]["top1"] > val["ema"]["top1"] else "ema")
    meta = json.loads((out / "model" / "vitkit.json").read_text())
    assert meta["labels"] == ["q0", "q1", "q2", "q3"]
    assert meta["extra"]["weights"] == results["exported_weights"]
    assert meta["extra"]["val_top1"] == results["val"][results["exported_weights"]]["top1"]
    assert meta["preprocessing"]["size"] == [16, 16] and meta["preprocessing"]["mean"] == [0.2] * 3
    # the resolved recipe reproduces the run's configuration, with the backend it ran with filled in
    saved, given = load_recipe(out / "recipe.yaml").to_dict(), load_recipe(task[2]).to_dict()
    assert given["train"].pop("backend") is None and saved["train"].pop("backend") == results["backend"]["declared"]
    assert saved == given


def test_killed_run_resumes_to_identical_weights(task, full_run):
    d, _, recipe = task
    out = d / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "vitkit", "train", "-r", str(recipe), "--out", str(out),
                             "--no-progress"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = out / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and proc.poll() is None:
        if ckpt.is_file():
            try:
                step = torch.load(ckpt, weights_only=True)["step"]
            except Exception:  # being replaced: try again
                step = 0
            if step >= 12:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
    proc.wait()
    assert 12 <= step < 96 and not (out / "results.json").exists()
    res = _vitkit("train", "-r", recipe, "--out", out, "--resume", "--no-progress")
    assert "test accuracy" in res.stdout
    a = load_file(str(full_run[0] / "model" / "model.safetensors"))
    b = load_file(str(out / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = json.loads((full_run[0] / "results.json").read_text())
    rb = json.loads((out / "results.json").read_text())
    assert ra["test_top1"] == rb["test_top1"] and ra["val"] == rb["val"]
    # the metrics of the resumed run continue without duplicates
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "train"]
    assert steps == list(range(4, 97, 4))
    # evaluations carry the run's training time, resumed parts included: it never restarts
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    times = [r["train_time"] for r in evals]
    assert len(evals) >= 6 and times == sorted(times) and times[-1] == pytest.approx(rb["trained_s"], abs=0.1)


def test_resume_and_overwrite_guards(task, full_run, tmp_path):
    _, _, recipe = task
    r = _vitkit("train", "-r", recipe, "--out", full_run[0], check=False)
    assert r.returncode == 1 and "--resume" in r.stderr
    r = _vitkit("train", "-r", recipe, "--out", tmp_path / "none", "--resume", check=False)
    assert r.returncode == 1 and "no checkpoint" in r.stderr


def test_nan_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(task, tmp_path):
    _, data, recipe_file = task
    recipe = load_recipe(recipe_file, {"train.ckpt_every": 5, "train.ema": 0.0})
    trainer = Trainer(recipe, tmp_path / "run", progress=False)
    real = trainer.step_fn
    calls = []

    def poisoned(x, y):
        calls.append(1)
        if len(calls) == 8:  # something blows up at step 8
            with torch.no_grad():
                trainer.run.model.blocks[0].mlp.fc1.weight.fill_(float("nan"))
        return real(x, y)

    trainer.step_fn = poisoned
    with pytest.raises(TrainingDiverged, match=r"diverged at step 8.*last good checkpoint \(step 5\)"):
        trainer.fit()
    st = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert st["step"] == 5
    assert all(torch.isfinite(v).all() for v in st["model"].values())
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "diverged" and rows[-1]["step"] == 8


def test_finetune_from_a_checkpoint_resizes_positions_and_replaces_the_head(task, tmp_path):
    _, data, recipe_file = task
    src = VisionTransformer(img_size=8, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=7,
                            in_chans=1)
    with torch.no_grad():
        src.head.weight.normal_()
    save_model(src, tmp_path / "pre")
    recipe = load_recipe(recipe_file, {"init.checkpoint": str(tmp_path / "pre"), "model": {"img_size": 16},
                                       "schedule.steps": 3, "schedule.warmup_steps": 1,
                                       "train.eval_every": 0})
    trainer = Trainer(recipe, tmp_path / "ft", progress=False)
    m = trainer.run.model
    assert m.config.img_size == (16, 16) and m.config.num_classes == 4 and m.config.width == 32
    assert m.pos_embed.shape == (1, 17, 32)  # 2x2 grid + class slot -> 4x4 grid + class slot
    assert torch.count_nonzero(m.head.weight) == 0  # the paper's zero head
    assert torch.equal(m.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight)
    assert any("pos_embed" in n for n in trainer.run.init_notes)
    res = trainer.fit()
    assert res["steps"] == 3


def test_eval_cli_matches_the_runs_own_test_accuracy(task, full_run):
    _, data, _ = task
    out = full_run[0]
    r = _vitkit("eval", out / "model", "--data", f"tensors:{data}", "--json")
    res = json.loads(r.stdout)
    expected = json.loads((out / "results.json").read_text())["test_top1"]
    assert res["n"] == 128 and abs(res["top1"] - expected) < 1e-9
    r = _vitkit("eval", out / "model", "--data", f"tensors:{data}", "--split", "validation", check=False)
    assert r.returncode == 1 and "validation" in r.stderr


def test_flip_tta_scores_the_mean_probability_of_an_image_and_its_mirror(task, full_run):
    from vitkit.data.datasets import open_dataset
    from vitkit.data.loader import eval_batches
    from vitkit.train.evaluate import evaluate, transform_for
    from vitkit.train.weights import load_for_eval

    _, data, _ = task
    out = full_run[0]
    res = json.loads(_vitkit("eval", out / "model", "--data", f"tensors:{data}", "--json", "--tta", "flip").stdout)
    model, _, pre = load_for_eval(out / "model")
    model.eval()
    ds = open_dataset(f"tensors:{data}", "test")
    tf = transform_for(pre, model.config, ds)
    (images, y), = list(eval_batches(ds, 1000, 0, 1, 0))
    x = tf(images)
    with torch.no_grad():
        p = (model(x).softmax(1) + model(x.flip(-1)).softmax(1)) / 2
    assert res["tta"] == "flip" and res["n"] == len(y) == 128
    assert abs(res["top1"] - (p.argmax(1) == y).double().mean().item()) < 1e-9
    assert abs(res["loss"] - torch.nn.functional.nll_loss(p.log(), y).item()) < 1e-5
    # a mirror-symmetric batch scores the same with and without TTA
    one = evaluate(model, ds, lambda b: tf(torch.cat([b[..., :8], b[..., :8].flip(-1)], -1)))
    two = evaluate(model, ds, lambda b: tf(torch.cat([b[..., :8], b[..., :8].flip(-1)], -1)), tta="flip")
    assert one["top1"] == two["top1"] and abs(one["loss"] - two["loss"]) < 1e-5
    with pytest.raises(ValueError, match="tta"):
        evaluate(model, ds, tf, tta="crops")


def test_distillation_teaches_the_student_what_the_teacher_predicts(task, full_run, tmp_path):
    """alpha 1: the labels are unused, so the student learns the task from a trained teacher (the full run's
    model) and nothing useful from an untrained one."""
    _, _, recipe_file = task
    teacher = full_run[0] / "model"
    untrained = VisionTransformer(load_recipe(recipe_file).model_config(num_classes=4, in_chans=1))
    save_model(untrained, tmp_path / "untrained", labels=["q0", "q1", "q2", "q3"])
    accs = {}
    for name, path in (("trained", teacher), ("untrained", tmp_path / "untrained")):
        recipe = load_recipe(recipe_file, {"distill.teacher": str(path), "distill.alpha": 1.0,
                                           "train.eval_every": 0, "train.ckpt_every": 0, "train.ema": 0.0,
                                           # clean images: on this toy task the shift between augmented
                                           # and clean images makes 96-step runs vary from seed to seed
                                           "augment.crop": "none", "augment.erasing": 0.0})
        accs[name] = Trainer(recipe, tmp_path / name, progress=False).fit()
    expected = json.loads((full_run[0] / "results.json").read_text())["test_top1"]
    assert abs(accs["trained"]["teacher_test_top1"] - expected) < 1e-9  # the teacher, in its preprocessing
    assert accs["trained"]["test_top1"] > 0.8 and accs["trained"]["teacher"] == str(teacher)  # (0.97 here)
    assert accs["untrained"]["teacher_test_top1"] < 0.4 and accs["untrained"]["test_top1"] < 0.5  # chance: 0.25
    # DeiT's distillation token, alpha 1: the teacher term goes to the distillation head alone, so the class
    # head stays at its zero init and the student predicts through the distillation token (class-token
    # read-outs need a lower lr and more steps than GAP on this task)
    recipe = load_recipe(recipe_file, {"distill.teacher": str(teacher), "distill.alpha": 1.0, "optim.lr": 2e-3,
                                       "schedule.epochs": 12, "train.eval_every": 0, "train.ckpt_every": 0,
                                       "train.ema": 0.0, "augment.crop": "none", "augment.erasing": 0.0,
                                       "model.class_token": True, "model.pool": "token", "model.distill_token": True})
    res = Trainer(recipe, tmp_path / "token", progress=False).fit()
    student = load_weights(tmp_path / "token" / "model")
    assert student.config.distill_token and not hasattr(student, "distilled_training")
    assert student.head.weight.abs().sum() == 0 and student.head_dist.weight.abs().sum() > 0
    assert res["test_top1"] > 0.85, res["test_top1"]


def test_periodic_evaluations_of_the_raw_weights_only(task, full_run, tmp_path):
    """train.eval_ema false: the periodic evaluations score the raw weights only, with the same numbers as a
    run that scores both (evaluating takes nothing from training); the final evaluation still scores both
    and the exported model is the same."""
    _, _, recipe = task
    out = tmp_path / "raw-only"
    _vitkit("train", "-r", recipe, "--out", out, "--no-progress", "--set", "train.eval_ema=false")

    def evals(folder):
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r["kind"] == "eval"]
    both, raw = evals(full_run[0]), evals(out)
    assert len(raw) == len(both) == 6
    assert all("top1_ema" not in r for r in raw[:-1]) and all("top1_ema" in r for r in both)
    assert [(r["step"], r["top1"], r["loss"]) for r in raw] == [(r["step"], r["top1"], r["loss"]) for r in both]
    assert raw[-1]["top1_ema"] == both[-1]["top1_ema"]
    a, b = (json.loads((f / "results.json").read_text()) for f in (full_run[0], out))
    assert (a["exported_weights"], a["test_top1"]) == (b["exported_weights"], b["test_top1"])
    wa, wb = (load_file(str(f / "model" / "model.safetensors")) for f in (full_run[0], out))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_time_budget_compresses_the_schedule_and_ends_the_run(task, tmp_path):
    """schedule.minutes: the lr follows training time when it runs ahead of the step count, and the run
    stops when the budget is spent (a fake clock: every step takes one second)."""
    _, _, recipe_file = task
    recipe = load_recipe(recipe_file, {"schedule.minutes": 0.5, "train.log_every": 1, "train.ckpt_every": 0})
    trainer = Trainer(recipe, tmp_path / "run", progress=False)
    now = [0.0]
    trainer.clock = lambda: now[0]
    real = trainer.step_fn

    def one_second(x, y):
        now[0] += 1.0
        return real(x, y)

    trainer.step_fn = one_second
    res = trainer.fit()
    assert trainer.run.total_steps == 96
    assert res["steps"] == 30 and res["stopped_by"] == "time budget" and res["trained_s"] == 30.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows if r["kind"] == "train"]
    # step k (0-based) runs after k seconds: the schedule stands at max(k, k / 30 * 96)
    assert lrs == pytest.approx([trainer.run.schedule(max(k, int(k / 30 * 96))) for k in range(30)])
    assert lrs[-1] < 0.01 * recipe.optim.lr  # the decay was completed within the budget
    assert [r for r in rows if r["kind"] == "eval"][-1]["final"]
    st = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert st["trained_s"] == 30.0  # resumed runs continue the budget where it stood


def test_patch_dropout_schedule(task, tmp_path):
    _, _, recipe_file = task
    recipe = load_recipe(recipe_file, {"model.patch_drop": 0.5, "schedule.patch_drop_end": 0.0,
                                       "schedule.patch_drop_from": 0.5})
    trainer = Trainer(recipe, tmp_path / "run", progress=False)
    total = trainer.run.total_steps
    assert [trainer.run.patch_drop_at(s) for s in (0, total // 2, 3 * total // 4, total)] == \
        pytest.approx([0.5, 0.5, 0.25, 0.0])
    seen = []
    real = trainer.step_fn

    def spy(x, y, **forward_kw):
        seen.append(forward_kw["patch_drop"])
        return real(x, y, **forward_kw)

    trainer.step_fn = spy
    trainer.fit()
    assert seen == pytest.approx([trainer.run.patch_drop_at(s) for s in range(total)])
    bad = load_recipe(recipe_file, {"schedule.patch_drop_end": 0.25})  # from no patch dropout
    with pytest.raises(ValueError, match="model.patch_drop"):
        Trainer(bad, tmp_path / "bad", progress=False)
    none = Trainer(load_recipe(recipe_file, {"schedule.patch_drop_end": 0.0}), tmp_path / "none", progress=False)
    assert none.run.patch_drop_at(none.run.total_steps) == 0.0  # ending at 0 from 0: nothing to schedule
    with pytest.raises(ValueError, match="patch_drop_end"):
        load_recipe(recipe_file, {"model.patch_drop": 0.5, "schedule.patch_drop_end": 1.0})
    with pytest.raises(ValueError, match="minutes"):
        load_recipe(recipe_file, {"schedule.minutes": 0})


def _cpu_scaler(precision):
    """The fp16 path's loss scaling on the CPU (fp32 compute): a scale that doubles every step, so a resume
    that forgot the saved scale would continue from the initial one."""
    return torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=1)


def test_resume_restores_the_gradient_scalers_loss_scale(task, tmp_path, monkeypatch):
    import vitkit.train.rundata as rundata

    monkeypatch.setattr(rundata, "grad_scaler", _cpu_scaler)  # the run state's scaler, as fp16 on CUDA has
    _, _, recipe_path = task
    recipe = load_recipe(recipe_path, {"train.ckpt_every": 8, "train.predictions": 0})
    full = Trainer(recipe, tmp_path / "full", progress=False)
    full.fit()
    Trainer(recipe, tmp_path / "part", progress=False, stop_after=10).fit()
    part = Trainer(recipe, tmp_path / "part", resume=True, progress=False)
    assert part.step_fn.scaler is part.state.scaler  # the step scales with the scaler the state saves
    assert part.state.step == 8 and part.state.scaler.get_scale() == 2.0 ** 8
    part.fit()
    assert part.state.scaler.get_scale() == full.state.scaler.get_scale() == 2.0 ** full.state.step
    assert part.state.scaler.state_dict() == full.state.scaler.state_dict()
    for k, v in full.run.model.state_dict().items():
        assert torch.equal(v, part.run.model.state_dict()[k]), k


def test_run_state_round_trips_whole_through_a_checkpoint(tmp_path):
    """Everything the run state holds comes back from checkpoints/last.pt: weights, optimiser moments, EMA,
    the loss scale and its growth tracker, step, data position, training time, metrics line count, RNG."""
    from vitkit.train import EMA
    from vitkit.train.checkpoint import RunState
    from vitkit.train.distributed import Dist

    def state(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        return RunState(model, opt, ema=EMA(model, 0.9), scaler=torch.amp.GradScaler("cpu", init_scale=4.0,
                        growth_interval=3), steps_per_epoch=5, total_steps=20)

    a = state(0)
    for _ in range(7):  # 7 steps: a loss scale grown twice, a growth tracker at 1, moments, an EMA
        loss = a.model(torch.randn(2, 4)).square().sum()
        a.scaler.scale(loss).backward()
        a.scaler.step(a.optimizer)
        a.scaler.update()
        a.optimizer.zero_grad()
        a.end_step(a.trained_s + 1.5, a.model)
    assert a.step == 7 and a.position == (1, 2) and a.scaler.get_scale() == 16.0
    a.save(tmp_path, Dist(), metrics_rows=11, recipe={"name": "x"})
    after = torch.rand(3)  # the RNG after the save, which a resume must reproduce
    b = state(1)
    b.restore(tmp_path / "checkpoints" / "last.pt")
    assert torch.equal(torch.rand(3), after)
    assert (b.step, b.position, b.trained_s, b.metrics_rows) == (7, (1, 2), 10.5, 11)
    assert b.scaler.state_dict() == a.scaler.state_dict() and b.scaler.state_dict()["_growth_tracker"] == 1
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
    assert b.ema.updates == 7 and all(torch.equal(a.ema.shadow[k], b.ema.shadow[k]) for k in a.ema.shadow)
    longer = RunState(b.model, b.optimizer, steps_per_epoch=5, total_steps=30)
    with pytest.raises(ValueError, match="20-step run"):
        longer.restore(tmp_path / "checkpoints" / "last.pt")
