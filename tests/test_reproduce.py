"""vitkit reproduce: the claims table, the learning-rate sweep, resume after an interrupted arm, parallel runs
(end to end on a tiny synthetic data set: test_reproduce_e2e.py; the statistics: test_reproduce_stats.py)."""

import pytest
import torch

from _synthetic import write_npz
from vitkit.reproduce import (
    arms_table,
    claims_table,
    get_budget,
    markdown,
    measure,
    plan,
    runner,
    runs,
    sweep,
)
from vitkit.reproduce.claims import AtBest, Best


# --- the claims table -----------------------------------------------------------------------------------
def test_claims_table_names_existing_arms():
    arms, claims = arms_table(), claims_table()
    assert sorted(claims) == list(range(1, 11))
    for c in claims.values():
        for name in c.arms:
            assert name in arms, (c.id, name)
        for t in c.tests:
            for name, _ in t.weights:
                assert (name in arms) if isinstance(name, str) else name.candidates(arms), (c.id, name)
        assert c.can and c.cannot, c.id  # each claim says what this scale can and cannot test
    _, _, names = plan(None, get_budget("full"))
    assert len(names) == len(set(names))
    assert names.index("res-pre20") < names.index("res-ft28") and names.index("mpp") < names.index("few-mpp")
    # every recipe the arms ask for resolves (model fields, overrides, the budget's lengths, class subsets)
    from vitkit.train import load_recipe
    for name in names:
        for budget in ("quick", "full"):
            arm = arms[name].at_lr(1e-3) if arms[name].lr is None else arms[name]
            r = load_recipe(arm.recipe, runs.recipe_overrides(arm, 0, get_budget(budget), runs.Path("/nonexistent")))
            r.model_config(num_classes=10, in_chans=1)
            assert r.optim.lr == (1e-3 if arms[name].lr is None else arms[name].lr) or arm.kind == "init"


def test_selectors_choose_on_validation_accuracy():
    groups = {"token": [(1e-3, "t1"), (3e-3, "t3")], "gap": [(1e-3, "g1"), (3e-3, "g3")]}
    val = {"t1": [0.7, 0.72], "t3": [0.8, 0.8], "g1": [0.9, 0.9], "g3": [0.6, 0.6]}
    assert Best("token").resolve(groups, val) == "t3"
    assert AtBest("gap", "token").resolve(groups, val) == "g3"
    assert Best("gap").resolve(groups, val) == "g1"
    assert str(AtBest("gap", "token")) == "gap@best:token"
    with pytest.raises(ValueError, match="no validation results"):
        Best("gap").resolve(groups, {})


def test_the_sweep_chooses_each_familys_rate_on_validation_and_aliases_runs():
    """Each family's rate is its best mean validation accuracy (ties: the smaller rate); every arm of the
    family runs at it as ARM@lrX; a fine-tune follows its parent's run; two arms of one configuration share
    one run (the base ViT at 1e-3 is claim 2's GAP arm at 1e-3). The v2 table: a fine-tune at its parent's
    rate (v3's own fine-tuning sweep: tests/test_reproduce_converge.py)."""
    arms = arms_table(version=2)
    budget = get_budget("full").with_(lr_sweep=(1e-3, 3e-3), sweep_seeds=(0, 1))
    fams = sweep.families(["vit", "pe-none", "res-ft28", "gap-lr1e-3", "few-mpp"], arms)
    assert fams == ["vit", "res-pre20", "few-mpp"]
    points = sweep.sweep_arms(fams, arms, budget)
    assert set(points) == {"vit@lr1e-3", "vit@lr3e-3", "res-pre20@lr1e-3", "res-pre20@lr3e-3", "mpp",
                           "few-mpp@lr1e-3", "few-mpp@lr3e-3"}
    val = {"vit@lr1e-3": [0.8, 0.82], "vit@lr3e-3": [0.79, 0.80], "res-pre20@lr1e-3": [0.7, 0.7],
           "res-pre20@lr3e-3": [0.7, 0.7], "few-mpp@lr1e-3": [0.6, 0.6], "few-mpp@lr3e-3": [0.61, 0.6]}
    chosen = sweep.choose(fams, arms, budget, val)
    assert {f: c["lr"] for f, c in chosen.items()} == {"vit": 1e-3, "res-pre20": 1e-3, "few-mpp": 3e-3}
    # on a two-point grid every choice is an end of it; with a middle point, the middle is no edge
    assert {f: c["edge"] for f, c in chosen.items()} == {"vit": "smallest", "res-pre20": "smallest",
                                                         "few-mpp": "largest"}
    three = budget.with_(lr_sweep=(1e-3, 2e-3, 3e-3))
    mid = sweep.choose(["vit"], arms, three, {"vit@lr1e-3": [0.8, 0.8], "vit@lr2e-3": [0.9, 0.9],
                                              "vit@lr3e-3": [0.85, 0.85]})
    assert mid["vit"]["lr"] == 2e-3 and mid["vit"]["edge"] is None
    lines = markdown.sweep_edges({**chosen, "other": mid["vit"]})
    assert "2 of 4 families chose the smallest rate swept (vit, res-pre20)" in lines[1]
    assert "1 of 4 families chose the largest rate swept (few-mpp)" in lines[1]
    assert markdown.sweep_edges({"other": mid["vit"]}) == []
    table, alias = sweep.resolve(arms, chosen)
    assert alias["vit"] == "vit@lr1e-3" and alias["pe-none"] == "pe-none@lr1e-3"
    assert alias["gap-lr1e-3"] == "vit@lr1e-3"  # one configuration, one run
    assert table["vit@lr1e-3"].analysis  # measured with the analyses the base ViT asks for
    assert table[alias["res-ft28"]].parent == "res-pre20@lr1e-3" and table[alias["few-mpp"]].parent == "mpp"
    with pytest.raises(ValueError, match="1 of 2 seeds"):
        sweep.choose(fams, arms, budget, {**val, "vit@lr1e-3": [0.8]})


def test_nested_data_subsets():
    """Claim 3's subsets are nested: the 1k images are among the 6k, for the same seed."""
    from vitkit.data.loader import split_indices
    labels = torch.arange(10).repeat(600)
    small = set(split_indices(len(labels), 100 / len(labels), 1, labels)[1].tolist())
    large = set(split_indices(len(labels), 600 / len(labels), 1, labels)[1].tolist())
    assert len(small) == 100 and len(large) == 600 and small <= large


def test_rowcol_excess_sees_2d_structure():
    gh = gw = 5
    r, c = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    rows = (r.reshape(gh, gw, 1, 1) == r.reshape(1, 1, gh, gw)).float()
    cols = (c.reshape(gh, gw, 1, 1) == c.reshape(1, 1, gh, gw)).float()
    assert measure.rowcol_excess(0.5 * (rows + cols)) == pytest.approx(0.5)
    assert measure.rowcol_excess(torch.full((gh, gw, gh, gw), 0.3)) == pytest.approx(0.0)


# --- running --------------------------------------------------------------------------------------------
def tiny_budget(data):
    return get_budget("quick").with_(
        name="tiny", seeds=(0, 1), train_images=100, epochs=1, finetune_epochs=1, data_steps=2,
        data_sizes=(50, 100, 200), mpp_epochs=0.5, few_label_epochs=1, few_labels=100, val_size=100, test_images=40,
        fewshot_shots=(5,),
        lr_sweep=(3e-3,), curves=False,
        fewshot_seeds=(0,), analysis_images=8,
        data_note="4 synthetic classes (the bright quadrant), 500 training and 100 test images",
        extra={"data.dataset": f"tensors:{data}", "optim.batch_size": 25, "data.eval_batch_size": 100,
               "train.threads": 1})


@pytest.fixture
def tiny_data(tmp_path):
    return write_npz(tmp_path / "quadrants.npz", n_train=500, n_test=100, size=28, classes=4)


def test_resume_after_an_interrupted_arm(tmp_path, tiny_data):
    budget = tiny_budget(tiny_data).with_(epochs=3)
    arm = arms_table(budget.data_sizes)["vit"]
    root = tmp_path / "out"
    stopped = runs.run_arm(arm, 0, budget, root, stop_after=5)  # as if killed after 5 of 12 steps
    assert stopped == {"stopped_at": 5}
    folder = runs.run_folder(root, "vit", 0)
    assert not runs.is_done(folder)
    res = runs.run_arm(arm, 0, budget, root)  # picks the checkpoint up
    assert res["steps"] == 12 and runs.is_done(folder)
    # the same run uninterrupted ends with the same weights
    whole = runs.run_arm(arm, 0, budget, tmp_path / "other")
    assert whole["test_top1"] == res["test_top1"]
    from safetensors.torch import load_file
    a = load_file(str(folder / "model" / "model.safetensors"))
    b = load_file(str(runs.run_folder(tmp_path / "other", "vit", 0) / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a finished run is reused, not retrained
    mtime = (folder / "results.json").stat().st_mtime_ns
    assert runs.run_arm(arm, 0, budget, root)["steps"] == 12
    assert (folder / "results.json").stat().st_mtime_ns == mtime
    # ... unless the configuration changed (another budget in the same folder)
    with pytest.raises(ValueError, match="another configuration"):
        runs.run_arm(arm, 0, budget.with_(epochs=2), root)


def test_parallel_jobs_match_the_sequential_runs(tmp_path, tiny_data):
    """--jobs 2: the runs of claim 8 (MPP pre-training, then fine-tuning from it) trained by two worker
    processes end with the same numbers as one after the other, children after their parents; and one run
    folder is never trained by two processes at once."""
    budget = tiny_budget(tiny_data)  # train.threads 1: the same arithmetic in any process
    claims, arms, names = plan([8], budget)
    assert arms["few-mpp"].parent == "mpp"
    seq = runner.run_all(names, arms, budget, tmp_path / "seq", log=lambda s: None)
    lines = []
    par = runner.run_all(names, arms, budget, tmp_path / "par", log=lines.append, jobs=2)
    assert sorted(par) == sorted(seq) == sorted(names)
    for name in names:
        assert [m["seed"] for m in par[name]] == list(budget.seeds)
        for a, b in zip(seq[name], par[name]):
            assert {k: v for k, v in a.items() if k not in ("img_per_s", "train_s")} == \
                   {k: v for k, v in b.items() if k not in ("img_per_s", "train_s")}
    n_runs = len(names) * len(budget.seeds)
    starts = [x for x in lines if x.startswith("[")]
    ends = [x for x in lines if x.startswith("  ")]
    assert len(starts) == n_runs and all(": training" in x for x in starts)
    assert len(ends) == n_runs and f"({n_runs}/{n_runs};" in ends[-1] and "to go" in ends[0] and "to go" not in ends[-1]
    for seed in budget.seeds:  # the child started after its parent's model was written
        parent = runs.run_folder(tmp_path / "par", "mpp", seed) / "results.json"
        child = runs.run_folder(tmp_path / "par", "few-mpp", seed) / "recipe.yaml"
        assert parent.stat().st_mtime_ns <= child.stat().st_mtime_ns
    # a folder whose lock another process holds is not trained twice
    from vitkit.utils import exclusive
    folder = runs.run_folder(tmp_path / "lock", "few-scratch", 0)
    with exclusive(folder.parent / f"{folder.name}.lock"):
        with pytest.raises(RuntimeError, match="being trained by another process"):
            runs.run_arm(arms["few-scratch"], 0, budget, tmp_path / "lock")
    assert not (folder / "checkpoints").exists()
    runs.run_arm(arms["few-scratch"], 0, budget, tmp_path / "lock")  # free again
    assert runs.is_done(folder)
    # the report says how many ran at once
    from vitkit.reproduce import report as rep
    from vitkit.reproduce.markdown import compute_line
    c = rep.compute(par, wall_s=90.0, runs={"training": 6}, jobs=2)
    assert c["jobs"] == 2 and c["runs"] == 6 and c["complete"]
    assert "1.5 min wall for all of it, 2 runs at a time." in compute_line(c)
    assert "at a time" not in compute_line(rep.compute(par, wall_s=90.0, runs={"training": 6}))
    # and which machine and code trained the runs (recorded in provenance.json when each run started)
    from vitkit.bench.machine import hardware
    from vitkit.reproduce.measure import code_id, code_version
    assert c["machines"] == {hardware(): 6} and c["code_versions"] == {code_id(code_version()): 6}
    assert f"Trained on: {hardware()} (6 runs). Code: {code_id(code_version())} (6 runs)." in compute_line(c)
    old = {"x": [{k: v for k, v in m.items() if k not in ("machine", "code")} for m in par["few-scratch"][:1]]}
    line = compute_line(rep.compute({**par, **old}, wall_s=1.0, runs={}))
    assert "(6 runs). Not recorded for 1 run." in line and "unrecorded (1 runs)" in line


_INTERRUPTED_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from test_reproduce import tiny_budget
from vitkit.reproduce import plan, runner
budget = tiny_budget({data!r}).with_(epochs={epochs})
claims, arms, names = plan([1], budget)
try:
    runner.run_all(["vit", "pe-none"], arms, budget, {root!r}, jobs=2, log=lambda s: print(s, flush=True))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _live_in_group(pgid: int) -> list:
    """Processes of a process group that still run (zombies, which an init that does not reap leaves, aside)."""
    from pathlib import Path

    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/stat").is_file(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_parallel_runs_stop_at_once_on_ctrl_c_or_kill_and_resume(tmp_path, tiny_data, sig):
    """--jobs 2: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or a kill of the parent
    stops every worker within seconds, with no traceback from the workers; the runs resume afterwards."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = tmp_path / "out"
    epochs = 40
    code = _INTERRUPTED_CHILD.format(tests=str(Path(__file__).parent), data=str(tiny_data), epochs=epochs,
                                     root=str(root))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        ckpts = [runs.run_folder(root, a, 0) / "checkpoints" / "last.pt" for a in ("vit", "pe-none")]
        deadline = time.monotonic() + 240
        while not all(p.is_file() for p in ckpts):  # both runs are training (each has saved an epoch)
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.2)
        if sig == "SIGINT":
            os.killpg(child.pid, signal.SIGINT)
        else:
            os.kill(child.pid, signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130 and out.strip().endswith("interrupted"), (out, err)
    assert "Traceback" not in err and "leaked" not in err, err
    deadline = time.monotonic() + 10  # no worker is left training (the pool's helper exits with its pipe)
    while _live_in_group(child.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _live_in_group(child.pid)
    assert not any(runs.is_done(runs.run_folder(root, a, 0)) for a in ("vit", "pe-none"))
    budget = tiny_budget(tiny_data).with_(epochs=epochs)
    _, arms, _ = plan([1], budget)
    lines = []
    res = runner.run_all(["vit", "pe-none"], arms, budget.with_(seeds=(0,)), root, log=lines.append)
    assert sum(": resumed" in x for x in lines) == 2
    assert all(m[0]["test_top1"] is not None for m in res.values())


def test_validation_split_is_the_trainers(tmp_path, tiny_data):
    """The images the report probes (few-shot, attention) are exactly the trainer's validation split."""
    from vitkit.train import load_recipe
    from vitkit.train.trainer import Trainer
    budget = tiny_budget(tiny_data)
    arm = arms_table(budget.data_sizes)["vit"]
    recipe = load_recipe(arm.recipe, runs.recipe_overrides(arm, 1, budget, tmp_path))
    trainer = Trainer(recipe, tmp_path / "t", progress=False)
    train_part, val = measure.validation_split(recipe)
    assert len(val) == 100 and torch.equal(val.images, trainer.run.data.val.images)
    assert torch.equal(val.labels, trainer.run.data.val.labels)
    assert not set(map(bytes, val.images.numpy())) & set(map(bytes, trainer.run.data.train.images.numpy()))


def test_time_left_is_estimated_per_arm(tmp_path, monkeypatch):
    """The 'to go' estimate adds each remaining run's arm's measured training time (arms differ by 25x in
    the full budget), not the invocation's average pace; with --jobs N it divides by N."""
    from types import SimpleNamespace

    cost = {"a": 360.0, "b": 3600.0}
    monkeypatch.setattr(runner, "train_and_measure",
                        lambda arm, seed, budget, root, progress=False: {"seed": seed, "train_s": cost[arm.name]})
    arms = {n: SimpleNamespace(name=n, parent=None) for n in cost}
    lines = []
    runner.run_all(["a", "b"], arms, SimpleNamespace(seeds=(0, 1)), tmp_path, log=lines.append)
    ends = [x for x in lines if x.startswith("  ")]
    # a0 done: b0, a1, b1 left, only a's time known -> 3 x 360 s; b0 done: a1 + b1 = 3960 s; a1 done: b1
    assert [e.split("about ")[-1] if "about" in e else None for e in ends] == \
           ["0.3 h of training)", "1.1 h of training)", "1.0 h of training)", None]


def test_the_extra_is_checked_first(tmp_path, tiny_data, monkeypatch, capsys):
    """Without the reproduce extra the command stops before training anything, in one line naming it."""
    import importlib.util

    from vitkit.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a))
    assert main(["reproduce", "--claims", "8", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert "pip install 'vitkit[reproduce]'" in err and "scipy" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()
