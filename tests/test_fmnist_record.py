"""benchmarks/fmnist_record.py end to end on tiny models (--smoke): the convolutional teacher trained by vitkit,
a pure-ViT student distilled from its exported folder, the paired student without distillation, an ablation
arm, each exported model tested once through the independent path, and the JSON files the record is read from."""
import json
import sys
from pathlib import Path

import pytest
import torch

from _synthetic import write_npz
from vitkit.checkpoints import load_weights
from vitkit.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_smoke_pipeline_teacher_to_distilled_student_to_json(tmp_path, monkeypatch):
    import fmnist_record

    data = write_npz(tmp_path / "q.npz", n_train=200, n_test=64, size=28)
    out = tmp_path / "out"
    assert fmnist_record.main(["--smoke", "--data", f"tensors:{data}", "--out", str(out), "--seeds", "0",
                               "--arms", "all", "--ablations", "soft"]) == 0
    teacher = json.loads((out / "teacher.json").read_text())
    dist = json.loads((out / "distill-seed0.json").read_text())
    plain = json.loads((out / "plain-seed0.json").read_text())
    soft = json.loads((out / "soft-seed0.json").read_text())
    summary = json.loads((out / "summary.json").read_text())

    # the teacher is a CNN built by the one model factory (a depth-0 ResNet-18-shaped net with a 3x3 root)
    t_model = load_weights(teacher["model"])
    cfg = t_model.config
    assert (cfg.depth, cfg.backbone, cfg.backbone_stem, cfg.backbone_unit) == (0, "resnet", "3x3", "basic")
    assert any(isinstance(m, torch.nn.GroupNorm) for m in t_model.modules())
    # the student learned from the teacher's exported folder; the paired arm and its recipe had none
    assert dist["teacher"] == teacher["model"] and dist["overrides"]["distill.teacher"] == teacher["model"]
    assert plain["teacher"] is None and plain["overrides"]["model.distill_token"] is False
    assert soft["teacher"] == teacher["model"] and soft["overrides"]["distill.kind"] == "soft"
    # the distilled student is a pure ViT with DeiT's distillation token: no convolution but the patch projection
    s_model = load_weights(str(Path(dist["run"]) / "model"))
    convs = [n for n, m in s_model.named_modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs == ["patch_embed.proj"] and s_model.config.distill_token and s_model.config.backbone is None
    # the trainer read no test image; the exported folders were tested once, by the independent path
    for rec in (teacher, dist, plain, soft):
        assert not [r for r in _metrics(rec["run"]) if r.get("kind") == "test"]
        assert "test_top1" not in json.loads((Path(rec["run"]) / "results.json").read_text())
        assert rec["curve"] and rec["curve"][-1]["final"] and rec["machine"]["cores"] >= 1
        assert rec["trainer_test_top1"] is None
    for rec in (teacher, dist, plain):
        assert rec["test"]["images"] == 64 and 0.0 <= rec["test"]["top1"] <= 1.0
        assert rec["test"]["path"] == "vitkit.train.evaluate_checkpoint"
    assert "test" not in soft  # an ablation is judged on validation only
    # times: each main seed carries its share of the one teacher's wall time
    assert dist["teacher_share_s"] == round(teacher["wall_s"], 1)
    assert abs(dist["wall_with_teacher_s"] - (dist["wall_s"] + teacher["wall_s"])) < 0.2
    # the summary: the paired difference is the seed's distilled minus plain test accuracy
    assert summary["smoke"] is True and summary["arms"]["distill"]["seeds"] == [0]
    diff = summary["paired_difference_test_top1"]["values"]
    assert diff == [dist["test"]["top1"] - plain["test"]["top1"]]
    assert summary["ablation_val_top1"]["soft"]["0"] == soft["val"][soft["exported_weights"]]["top1"]
    assert summary["targets"]["margin_met"] is False  # one seed cannot show a margin over the seeds' spread
    assert summary["code"]["vitkit"] and "fmnist_record.py --smoke" in summary["command"]
    assert (out / "fmnist-record.png").stat().st_size > 0

    # started again (here on "another machine"), the benchmark reuses every finished run: nothing is trained or
    # tested a second time
    monkeypatch.setattr(fmnist_record, "machine_info", lambda: {"cores": 64, "date": "later"})
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    assert fmnist_record.main(["--smoke", "--data", f"tensors:{data}", "--out", str(out), "--seeds", "0",
                               "--arms", "all", "--ablations", "soft", "--ablation-seeds", "0"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()} == stamps
    again = json.loads((out / "distill-seed0.json").read_text())
    assert again["test"] == dist["test"] and again["how"] == "trained" and again["wall_s"] == dist["wall_s"]
    # each record keeps the machine line and the command of the invocation that wrote it, not the reusing one's
    assert again["machine"] == dist["machine"] and again["command"] == dist["command"]
    assert dist["command"].endswith("--ablations soft")
    assert json.loads((out / "teacher.json").read_text())["machine"] == teacher["machine"]
    assert json.loads((out / "summary.json").read_text())["arms"] == summary["arms"]


def _metrics(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_an_unknown_ablation_is_refused_before_any_training(tmp_path):
    import fmnist_record

    with pytest.raises(SystemExit, match="unknown arm 'no-flip'.*no-randaugment"):
        fmnist_record.main(["--smoke", "--out", str(tmp_path), "--arms", "all", "--ablations", "soft,no-flip"])
    assert not (tmp_path / "runs").exists()


def test_summary_pairs_seeds_and_judges_the_targets():
    """Three seeds: the paired differences, their one-sided t-test (scipy's value), the spread margin, the
    budget (not judged when a seed was resumed) and the ablation table."""
    import fmnist_record
    scipy_stats = pytest.importorskip("scipy.stats")

    def rec(arm, seed, top1, val, wall=9000.0, resumed=False):
        out = {"seed": seed, "val": {"ema": {"top1": val}}, "exported_weights": "ema",
               "wall_with_teacher_s": wall, "wall_complete": not resumed}
        return out if top1 is None else {**out, "test": {"top1": top1}}  # an ablation arm reads no test

    dist = [0.952, 0.955, 0.951]
    plain = [0.940, 0.941, 0.942]
    results = {"distill": [rec("distill", s, t, 0.96) for s, t in enumerate(dist)],
               "plain": [rec("plain", s, t, 0.95) for s, t in enumerate(plain)],
               "soft": [rec("soft", 0, None, 0.957)]}
    teacher = {"wall_complete": True, "test": {"top1": 0.955}}
    s = fmnist_record.summarise(teacher, results, [0, 1, 2], command="x", smoke=False)
    diffs = [a - b for a, b in zip(dist, plain)]
    d = s["paired_difference_test_top1"]
    assert d["values"] == diffs and abs(d["mean"] - sum(diffs) / 3) < 1e-12
    assert abs(d["p_one_sided"] - scipy_stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue) < 1e-12
    t = s["targets"]
    assert t["top1_met"] and t["budget_met"] is True and t["margin_met"]  # min difference 0.009 > spread 0.002
    assert t["budget_machines"] == []  # these records name no machine
    assert abs(t["seed_spread"] - scipy_stats.tstd(dist)) < 1e-12
    assert s["ablation_val_top1"]["soft"] == {"0": 0.957} and "test_top1" not in s["arms"]["soft"]
    # a close plain seed: the margin is not met; a resumed seed: the budget is not judged; a slow one fails it
    results["plain"][1] = rec("plain", 1, 0.9545, 0.95)
    results["distill"][2] = rec("distill", 2, 0.951, 0.96, wall=11000.0, resumed=True)
    t = fmnist_record.summarise(teacher, results, [0, 1, 2], command="x", smoke=False)["targets"]
    assert t["margin_met"] is False and t["budget_met"] is None
    results["distill"][2] = rec("distill", 2, 0.951, 0.96, wall=11000.0)
    t = fmnist_record.summarise(teacher, results, [0, 1, 2], command="x", smoke=False)["targets"]
    assert t["budget_met"] is False and t["max_wall_with_teacher_s"] == 11000.0


def test_a_run_spread_over_invocations_keeps_its_whole_wall_time(tmp_path, monkeypatch):
    """The ledger beside a run folder: an invocation stopped mid-run (Ctrl-C, SIGTERM) closes its segment with
    its wall time, the next one resumes and adds its own, and the run's wall time is their sum, whole; a
    process killed outright leaves its segment open, and then the wall time is not whole. A run started
    outside the ledger (a checkpoint, no ledger) is never whole."""
    import fmnist_record
    from vitkit.bench.machine import hardware

    calls = []

    def fake_train(recipe, folder, resume, progress):  # stands in for vitkit.train.train
        calls.append(resume)
        (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
        (folder / "checkpoints" / "last.pt").write_bytes(b"x")
        if len(calls) == 1:
            raise KeyboardInterrupt  # the first invocation is stopped
        (folder / "model").mkdir(exist_ok=True)
        (folder / "metrics.jsonl").write_text("")
        (folder / "results.json").write_text(json.dumps({"trained_s": 1.0}))

    monkeypatch.setattr(fmnist_record, "train", fake_train)
    run = tmp_path / "runs" / "distill-seed0"
    with pytest.raises(KeyboardInterrupt):
        fmnist_record.train_or_reuse("fmnist-record", {}, run)
    first = fmnist_record.wall_account(run)
    assert first["segments"] == 1 and first["wall_complete"] and first["wall_s"] >= 0.0
    assert json.loads((tmp_path / "runs" / "distill-seed0.wall.json").read_text())["segments"][0]["ended"] == "stopped"
    res, how = fmnist_record.train_or_reuse("fmnist-record", {}, run)
    assert how == "resumed" and calls == [False, True] and res == {"trained_s": 1.0}
    led = json.loads((tmp_path / "runs" / "distill-seed0.wall.json").read_text())["segments"]
    assert [s["ended"] for s in led] == ["stopped", "finished"] and [s["resumed"] for s in led] == [False, True]
    whole = fmnist_record.wall_account(run)
    assert whole["segments"] == 2 and whole["wall_complete"]
    assert whole["wall_s"] == pytest.approx(sum(s["wall_s"] for s in led), abs=0.051)
    rec = fmnist_record._record("distill", "fmnist-record", 0, {}, run, res, how, "python benchmarks/fmnist_record.py")
    assert rec["resumed"] and rec["wall_complete"] and rec["wall_s"] == whole["wall_s"] and rec["segments"] == 2
    assert rec["trained_on"] == [hardware()]  # the kind of machine of every invocation that trained it
    # reused: nothing is trained and the ledger is untouched
    assert fmnist_record.train_or_reuse("fmnist-record", {}, run)[1] == "reused" and len(calls) == 2

    # a segment left open (the process was killed outright): the wall time is not whole
    killed = tmp_path / "runs" / "plain-seed0"
    fmnist_record._write_segments(killed, [{"resumed": False, "wall_s": None, "ended": None}])
    (killed / "checkpoints").mkdir(parents=True)
    (killed / "checkpoints" / "last.pt").write_bytes(b"x")
    fmnist_record.train_or_reuse("fmnist-record", {}, killed)
    assert calls[-1] is True and fmnist_record.wall_account(killed)["wall_complete"] is False
    # a checkpoint from before the ledger: resumed, never whole
    outside = tmp_path / "runs" / "soft-seed0"
    (outside / "checkpoints").mkdir(parents=True)
    (outside / "checkpoints" / "last.pt").write_bytes(b"x")
    fmnist_record.train_or_reuse("fmnist-record", {}, outside)
    assert fmnist_record.wall_account(outside) == {"wall_s": pytest.approx(0.0, abs=5.0), "segments": 1,
                                                   "wall_complete": False, "machines": [hardware()]}


def test_the_record_goes_on_from_its_state_on_another_machine(tmp_path, monkeypatch):
    """--state: stopped after the teacher (SIGTERM-like), the archive holds the teacher's weights and records
    and no checkpoint of a finished run; a fresh runs folder given only the archive reuses the teacher (its
    test read once) and trains the students from its weights; a hostile archive is one clear line."""
    import fmnist_record
    from vitkit.bench.machine import hardware

    data = write_npz(tmp_path / "q.npz", n_train=120, n_test=32, size=28)
    state, out = tmp_path / "state.tar.gz", tmp_path / "out"
    args = ["--smoke", "--data", f"tensors:{data}", "--out", str(out), "--seeds", "0", "--state", str(state)]
    real = fmnist_record.run_student

    def stop(*a, **k):
        raise SystemExit(143)
    monkeypatch.setattr(fmnist_record, "run_student", stop)
    with pytest.raises(SystemExit):
        fmnist_record.main(args + ["--runs", str(tmp_path / "first")])
    import tarfile
    with tarfile.open(state) as tar:
        names = sorted(m.name for m in tar.getmembers())
    assert "runs/teacher/model/model.safetensors" in names and "runs/teacher.wall.json" in names
    assert "runs/teacher/results.json" in names and not [n for n in names if "checkpoints" in n or n.endswith(".png")]
    teacher = json.loads((out / "teacher.json").read_text())

    monkeypatch.setattr(fmnist_record, "run_student", real)
    tested = []
    monkeypatch.setattr(fmnist_record, "independent_test",
                        lambda model_dir, *a, _real=fmnist_record.independent_test: tested.append(model_dir) or
                        _real(model_dir, *a))
    second = tmp_path / "second"
    assert fmnist_record.main(args + ["--runs", str(second)]) == 0
    assert [Path(p).parent.name for p in tested] == ["distill-seed0", "plain-seed0"]  # the teacher's test: once
    again = json.loads((out / "teacher.json").read_text())
    assert again["test"] == teacher["test"] and again["wall_s"] == teacher["wall_s"]
    assert json.loads((second / "teacher.wall.json").read_text())["segments"][0]["ended"] == "finished"
    dist = json.loads((out / "distill-seed0.json").read_text())
    assert dist["how"] == "trained" and dist["wall_complete"] and "test" in dist
    assert json.loads((out / "summary.json").read_text())["targets"]["budget_machines"] == [hardware()]
    with tarfile.open(state) as tar:  # the tested students' weights are no longer carried
        names = sorted(m.name for m in tar.getmembers())
    assert "runs/distill-seed0/results.json" in names and "runs/distill-seed0/model/model.safetensors" not in names

    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("runs/../../evil.py")
        tar.addfile(info, __import__("io").BytesIO(b""))
    with pytest.raises(SystemExit, match="lies outside the runs/ folder of a record state"):
        fmnist_record.main(args[:-1] + [str(bad), "--runs", str(tmp_path / "third")])
    assert not (tmp_path / "third").exists() and not (tmp_path / "evil.py").exists()


def test_price_times_every_arm_and_prices_a_seed_from_its_own_measurements(tmp_path):
    import fmnist_record_price as price

    data = write_npz(tmp_path / "q.npz", n_train=200, n_test=64, size=28)
    out = tmp_path / "price.json"
    assert price.main(["--smoke", "--data", f"tensors:{data}", "--out", str(out), "--steps", "4", "--warm", "2"]) == 0
    p = json.loads(out.read_text())
    assert set(p["timed"]) == {"teacher", "distill-on", "distill-off", "plain-on", "plain-off"}
    for t in p["timed"].values():
        assert t["s_per_step"] > 0 and t["to_step"] - t["from_step"] >= 2 and t["from_step"] >= 2
    # the estimates are the recipes' steps times the measured costs: the teacher's throughout, a student's
    # mean over its patch-dropout schedule (the recipe's rate until 80 % of the run, then falling to none)
    t, d = p["timed"], p["arms"]["distill"]
    assert p["teacher"]["estimate_s"] == pytest.approx(p["teacher"]["steps"] * t["teacher"]["s_per_step"], abs=0.1)
    on, off = t["distill-on"]["s_per_step"], t["distill-off"]["s_per_step"]
    assert d["patch_drop_from"] == 0.8 and d["s_per_step"] == pytest.approx(0.8 * on + 0.2 * (on + off) / 2, abs=1e-5)
    assert d["estimate_s"] == pytest.approx(d["steps"] * d["s_per_step"], abs=0.1)
    assert p["seed_estimate_s"] == pytest.approx(d["estimate_s"] + p["teacher"]["estimate_s"] / 3, abs=0.2)
    assert p["budget_s"] == 3 * 3600 and p["machine"]["cores"] >= 1 and "--smoke" in p["command"]


def test_the_price_and_the_record_build_the_same_overrides_from_the_same_flags():
    import fmnist_record
    import fmnist_record_price

    flags = ["--smoke", "--data", "tensors:x.npz", "--set", "schedule.epochs=7", "--teacher-set", "optim.lr=0.5"]
    teacher, student = fmnist_record.run_overrides(fmnist_record._parser().parse_args(flags))
    assert (teacher, student) == fmnist_record.run_overrides(fmnist_record_price._parser().parse_args(flags))
    # each run gets its own --set and its own tiny model, both the shared data and smoke settings
    assert teacher["optim.lr"] == 0.5 and "schedule.epochs" not in teacher
    assert student["schedule.epochs"] == 7 and student.get("optim.lr") != 0.5
    assert teacher["model.backbone_layers"] == [1, 1] and student["model.depth"] == 1
    assert teacher["data.dataset"] == student["data.dataset"] == "tensors:x.npz"
    assert fmnist_record.run_overrides(fmnist_record._parser().parse_args([])) == ({}, {})


def test_a_bad_override_is_refused_before_the_teacher_trains(tmp_path, monkeypatch):
    import fmnist_record

    monkeypatch.setattr(fmnist_record, "train_or_reuse", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(UsageError, match="expects key=value"):
        fmnist_record.main(["--smoke", "--out", str(tmp_path), "--set", "no-equals-sign"])


def test_another_student_recipe_runs_the_same_record_under_its_own_name(tmp_path):
    import fmnist_record

    data = write_npz(tmp_path / "q.npz", n_train=200, n_test=64, size=28)
    out = tmp_path / "out"
    argv = ["--recipe", "fmnist-record-v2", "--smoke", "--data", f"tensors:{data}", "--out", str(out), "--seeds", "0"]
    assert fmnist_record.main(argv) == 0
    dist = json.loads((out / "distill-seed0.json").read_text())
    plain = json.loads((out / "plain-seed0.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    # every record names the recipe it trained and the command that wrote it; the runs live under OUT/runs
    for rec in (dist, plain):
        assert rec["recipe"] == "fmnist-record-v2" and rec["command"].endswith(" ".join(argv))
        assert Path(rec["run"]).parent == (out / "runs").resolve()
        # the second recipe's augmentation, as the trainer resolved it (recipe.yaml of the run)
        saved = (Path(rec["run"]) / "recipe.yaml").read_text()
        assert "randaugment: null" in saved and "mixup: 0.0" in saved and "cutmix: 0.0" in saved
    assert json.loads((out / "teacher.json").read_text())["command"] == summary["command"] == dist["command"]
    assert summary["name"] == "fmnist-record-v2" and (out / "fmnist-record-v2.png").stat().st_size > 0
    assert dist["teacher"] and plain["teacher"] is None


def test_the_second_record_recipe_differs_from_the_first_only_in_augmentation_and_length():
    from vitkit.train import load_recipe

    first, second = load_recipe("fmnist-record"), load_recipe("fmnist-record-v2")
    assert (first.model, first.optim, first.distill, first.data) == (second.model, second.optim, second.distill,
                                                                     second.data)
    assert (first.train.precision, first.train.ema) == (second.train.precision, second.train.ema)
    long = load_recipe("fmnist-long").augment  # the lighter augmentation is fmnist-long's
    assert second.augment == long and first.augment != long
    assert second.schedule.epochs > first.schedule.epochs and second.schedule.patch_drop_from == 0.8
