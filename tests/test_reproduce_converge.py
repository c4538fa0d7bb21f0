"""vitkit reproduce v3: converged, fairly tuned arms. The plateau rule on validation curves, the sweep that
grows a grid past an end its best rate sits at and doubles a schedule until the chosen point converges (with
a cap), fine-tunes swept on their own after their parent, claim 3's data sizes each with their own rate and
schedule, curves for every arm, claim 4's precondition decided on validation, and claim 7's speed timed once
in the campaign and never when a report is rendered."""
import json
import math

import pytest

from vitkit.reproduce import convergence, report, rule, runs, stats, sweep, verdict
from vitkit.reproduce.budget import get_budget
from vitkit.reproduce.catalog import arms_table
from vitkit.reproduce.catalog import plan as catalog_plan


def test_plateau_rule():
    n = 2000
    flat = [[e, 0.85 + (0.001 if e % 2 else 0.0)] for e in range(12)]
    got = convergence.plateau(flat, n)
    assert got["converged"] and got["noise"] == pytest.approx(math.sqrt(0.851 * 0.149 / n), rel=1e-6)
    rising = [[e, 0.70 + 0.01 * e] for e in range(12)]  # +4 points over the last 4 evaluations
    got = convergence.plateau(rising, n)
    assert not got["converged"] and got["gain"] == pytest.approx(0.04) and "still gaining 4.00 pt" in got["why"]
    # a gain of 1.9 SE passes, 2.1 SE fails
    se = math.sqrt(0.85 * 0.15 / n)
    for k, ok in ((1.9, True), (2.1, False)):
        c = [[e, 0.85 - k * se] for e in range(11)] + [[11, 0.85]]
        assert convergence.plateau(c, n)["converged"] is ok, k
    assert not convergence.plateau(flat[:4], n)["converged"]  # too few points to show a plateau
    # the mean over seeds, on the points every seed has
    m = convergence.mean_curve([[[0, 0.5], [1, 0.7]], [[0, 0.7], [1, 0.9], [2, 0.95]]])
    assert [p for p, _ in m] == [0, 1] and [a for _, a in m] == pytest.approx([0.6, 0.8])


def _fake_train(peak, converge_at, log):
    """A training stand-in: validation accuracy peaks at rate ``peak`` (log scale); a run's curve still rises
    at its end unless its schedule is stretched ``converge_at`` times or more."""
    def train(names, table, seeds):
        log.append(sorted(names))
        out = {}
        for n in names:
            a = table[n]
            acc = 0.9 - 0.02 * abs(math.log2(a.lr / peak)) if a.lr else 0.5
            rise = 0.0 if a.stretch >= converge_at else 0.03
            curve = [[e, acc - rise * max(0, 11 - e) / 11] for e in range(12)]
            out[n] = [{"seed": s, "val_top1": acc, "curve": curve} for s in seeds]
        return out
    return train


def test_the_sweep_grows_the_grid_past_an_edge_and_doubles_the_schedule_until_converged():
    arms = arms_table()
    b = get_budget("full").with_(lr_sweep=(1e-3, 2e-3, 4e-3), sweep_seeds=(0, 1))
    log = []
    conv = lambda ms: convergence.converged_runs(ms, 5000)  # noqa: E731
    chosen, measured = sweep.grow(["vit"], arms, b, _fake_train(8e-3, 2.0, log), conv)
    c = chosen["vit"]
    # 4e-3 was the largest: the grid grew to 8e-3, then to 1.6e-2 (8e-3 was the largest then); 8e-3 is interior
    assert c["lr"] == pytest.approx(8e-3) and c["edge"] is None and c["extended"] == 2
    assert c["grid"] == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2])
    # the chosen point had not converged at the budget's schedule: doubled once, and then it had
    assert c["stretch"] == 2.0 and c["converged"] is True
    assert "vit@lr8e-3-x2" in measured and all(len(ms) == 2 for ms in measured.values())
    # a cap: a run that never converges stops at max_stretch and says so
    chosen, _ = sweep.grow(["vit"], arms, b.with_(max_stretch=4.0), _fake_train(2e-3, 99.0, []), conv)
    assert chosen["vit"]["stretch"] == 4.0 and chosen["vit"]["converged"] is False
    # extensions are capped too: a best rate that runs off the grid stays at the edge, and the check says so
    chosen, _ = sweep.grow(["vit"], arms, b.with_(grid_extensions=1), _fake_train(1.0, 1.0, []), conv)
    assert chosen["vit"]["edge"] == "largest" and chosen["vit"]["extended"] == 1


def test_fine_tunes_are_swept_on_their_own_after_their_parent():
    arms = arms_table()
    assert arms["res-ft28"].family == "res-ft28" and arms["res-ft20"].family == "res-ft20"
    assert arms_table(version=2)["res-ft28"].family == "res-pre20"  # the v2 campaign's sharing, kept to read it
    b = get_budget("full").with_(sweep_seeds=(0, 1))
    fams = sweep.families(["res-ft28", "res-ft20"], arms)
    assert fams == ["res-pre20", "res-ft28", "res-ft20"] and sweep.stages(fams, arms) == [
        ["res-pre20"], ["res-ft28", "res-ft20"]]
    log = []
    chosen, measured = sweep.grow(fams, arms, b, _fake_train(5e-4, 1.0, log),
                                  lambda ms: convergence.converged_runs(ms, 5000))
    # the parent's grid first; then the fine-tunes at the fine-tuning grid, from the parent's chosen run
    assert all("res-ft" not in n for n in log[0])
    parent = arms["res-pre20"].at_lr(chosen["res-pre20"]["lr"]).name
    ft_round = next(names for names in log if any(n.startswith("res-ft28@") for n in names))
    assert parent in ft_round
    assert chosen["res-ft28"]["grid"] == pytest.approx(sorted(b.finetune_lr_sweep)) and \
        chosen["res-ft28"]["lr"] == pytest.approx(5e-4)
    resolved, alias = sweep.resolve(arms, chosen)
    assert resolved[alias["res-ft28"]].parent == parent and resolved[alias["res-ft28"]].lr == pytest.approx(5e-4)


def test_claim3_sizes_each_get_their_rate_and_every_arm_a_curve(tmp_path):
    b = get_budget("full")
    arms = arms_table(b.data_sizes)
    data = [a for a in arms.values() if a.length == "data"]
    assert len({a.family for a in data}) == len(data) == 6  # each data size and model: its own sweep
    for name in ("vit", "res-ft28", "few-mpp", "data-vit-1k", "data-resnet-all", "xfer-ft-vit"):
        a = arms[name] if arms[name].lr is not None else arms[name].at_lr(1e-3)
        ov = runs.recipe_overrides(a, 0, b, tmp_path)
        assert ov["train.eval_every"] > 0, name
        if a.length == "data":  # eval_every in epochs: the run's steps over curve_points evaluations
            steps = ov["schedule.steps"]
            spe = runs._images(a, b) / 100
            assert ov["train.eval_every"] * spe == pytest.approx(steps / b.curve_points, rel=0.01)
    # a stretched schedule is the budget's times the stretch, and a run of its own
    a = arms["data-vit-1k"].at_lr(1e-3, 2.0)
    assert runs.recipe_overrides(a, 0, b, tmp_path)["schedule.steps"] == 2 * b.data_steps
    assert a.name == "data-vit-1k@lr1e-3-x2"
    e = arms["vit"].at_lr(1e-3, 4.0)
    assert runs.recipe_overrides(e, 0, b, tmp_path)["schedule.epochs"] == 4 * b.epochs
    # the v2 budgets keep their recipes (the committed v2 runs stay reusable)
    v2 = get_budget("full", version=2)
    assert runs.recipe_overrides(arms_table(v2.data_sizes, 2)["data-vit-1k"].at_lr(1e-3), 0, v2, tmp_path)[
        "train.eval_every"] == 0


def test_claim4_precondition_is_decided_on_validation():
    prereg = rule.load_plan()
    b = get_budget("full").with_(seeds=tuple(range(6)))
    claims, arms, names = catalog_plan([4], b)

    off = {"vit": 0, "hybrid": 1, "vit-large": 2, "hybrid-large": 4}  # each arm its own seed noise

    def build(large_val_gain):
        ms = {}
        for n in names:
            base = {"vit": 0.80, "hybrid": 0.82, "vit-large": 0.80, "hybrid-large": 0.81}[n]
            big = n == "vit-large"
            ms[n] = [{"seed": s, "test_top1": base + (0.03 if big else 0) + 0.002 * (((s + off[n]) * 5) % 3),
                      "val_top1": base + (large_val_gain if big else 0) + 0.002 * (((s + off[n]) * 7) % 3),
                      "code": None, "plan": prereg["sha256"], "params": 1, "macs": 1,
                      "curve": [[e, base] for e in range(12)]} for s in b.seeds]
        sweeps = {arms[n].family: {"lr": 2e-3, "edge": None, "val_top1": {}} for n in names}
        return report.build(claims, arms, {n: n for n in arms}, ms, b, plan=prereg, sweeps=sweeps)
    # on test the larger ViT wins by 3 points; on validation it does not: the gate is not met
    rep = build(0.0)
    t = next(t for t in rep["claims"][0]["tests"] if t.get("requires"))
    pre = next(x for x in rep["claims"][0]["tests"] if x["text"] == t["requires"][0])
    assert pre["verdict"] == stats.REPRODUCED  # its own (secondary) reading, on test
    assert t["verdict"] == verdict.NO_VERDICT and "not met on validation" in t["note"]
    assert t["gate"][0]["metric"] == "val_top1" and t["gate"][0]["estimate"] == pytest.approx(0.0, abs=0.003)
    rep = build(0.03)  # met on validation: the interaction gets its own reading
    t = next(t for t in rep["claims"][0]["tests"] if t.get("requires"))
    assert t["verdict"] != verdict.NO_VERDICT and t["gate"][0]["p"] < 0.05


def test_claim7_speed_is_timed_once_and_never_when_reporting(tmp_path, monkeypatch):
    from vitkit.reproduce import measure
    folders = {"vit-deep": tmp_path / "a", "axial": tmp_path / "b"}
    for f in folders.values():
        f.mkdir()
    calls = []
    monkeypatch.setattr(measure, "paired_speed", lambda fs, repeats: calls.append(repeats) or
                        {n: [100.0 + i for i in range(repeats)] for n in fs})
    lines = []
    # a report of finished runs never times: nothing stored, nothing timed
    assert measure.stored_speed(folders, 30, lines.append, time_now=False) == {} and not calls
    got = measure.stored_speed(folders, 30, lines.append)
    assert calls == [30] and len(got["axial"]) == 30
    stored = json.loads((folders["axial"] / measure.SPEED_FILE).read_text())
    assert stored["rounds"] == 30 and stored["runs"] == got
    # read back ever after, also when the campaign goes on
    assert measure.stored_speed(folders, 30, lines.append) == got and calls == [30]
    assert measure.stored_speed(folders, 30, lines.append, time_now=False) == got


def _fixed_train(slow, log):
    """A training stand-in for fixed-rate arms: the arms named in ``slow`` (arm -> stretch at which its curve
    stops rising) still gain at the end of a shorter schedule; MPP measures no accuracy, only its curve."""
    def train(names, table, seeds):
        log.append(sorted(names))
        out = {}
        for n in names:
            a = table[n]
            base = n.split("@", 1)[0]
            rise = 0.0 if a.stretch >= slow.get(base, 1.0) else 0.08
            curve = [[e, 0.8 - rise * max(0, 11 - e) / 11] for e in range(12)]
            val = None if a.kind == "mpp" else 0.8 + (a.lr or 0.0)
            out[n] = [{"seed": s, "val_top1": val, "curve": curve} for s in seeds]
        return out
    return train


def test_fixed_rate_arms_grow_their_schedule_by_the_same_rule():
    """Claim 2's read-outs and the MPP parent have rates of their own: the v3 sweep trains each at the sweep
    seeds and doubles its schedule until its curve converges (the cap as for a swept family); a fine-tune of a
    grown parent starts from the grown run."""
    arms = arms_table()
    b = get_budget("full").with_(sweep_seeds=(0, 1))
    names = catalog_plan([2, 8], b)[2]
    assert "mpp" not in sweep.families(names, arms) and "gap-lr1e-3" not in sweep.families(names, arms)  # v2
    fams = sweep.families(names, arms, fixed=True)
    assert {"mpp", "gap-lr1e-3", "token-lr1e-2", "few-mpp", "few-scratch"} <= set(fams)
    stages = sweep.stages(fams, arms)
    assert "mpp" in stages[0] and "few-mpp" in stages[1]  # the fine-tune after its parent's schedule is fixed
    log = []
    conv = lambda ms: convergence.converged_runs(ms, 5000)  # noqa: E731
    chosen, measured = sweep.grow(fams, arms, b, _fixed_train({"mpp": 2.0, "gap-lr1e-2": 4.0}, log), conv)
    assert chosen["mpp"]["stretch"] == 2.0 and chosen["mpp"]["converged"] and chosen["mpp"]["fixed"]
    assert chosen["gap-lr1e-2"]["stretch"] == 4.0 and chosen["gap-lr1e-2"]["lr"] == pytest.approx(1e-2)
    assert chosen["gap-lr1e-3"]["stretch"] == 1.0 and chosen["gap-lr1e-3"]["grid"] == [1e-3]
    assert chosen["mpp"]["edge"] is None and chosen["mpp"]["extended"] == 0  # one rate: nothing to extend
    assert "mpp@x2" in measured and "gap-lr1e-2@x4" in measured and "gap-lr1e-2@x2" in measured
    runs_, alias = sweep.resolve(arms, chosen)
    assert alias["mpp"] == "mpp@x2" and runs_["mpp@x2"].stretch == 2.0 and runs_["mpp@x2"].lr == 1e-3
    assert alias["gap-lr1e-3"] == "gap-lr1e-3" and alias["gap-lr1e-2"] == "gap-lr1e-2@x4"
    assert runs_[alias["few-mpp"]].parent == "mpp@x2"
    few_round = next(r for r in log if any(n.startswith("few-mpp@") for n in r))
    assert "mpp@x2" in few_round and "mpp" not in few_round
    b_tmp = get_budget("full")
    assert runs.recipe_overrides(runs_["mpp@x2"], 0, b_tmp, __import__("pathlib").Path("/tmp"))[
        "schedule.epochs"] == 2 * b_tmp.mpp_epochs
    # the cap: a fixed arm that never converges stops at max_stretch and says so
    chosen, _ = sweep.grow(fams, arms, b, _fixed_train({"token-lr3e-3": 99.0}, []), conv)
    assert chosen["token-lr3e-3"]["stretch"] == b.max_stretch and chosen["token-lr3e-3"]["converged"] is False
    # a stretched fixed arm's run name reads back as its arm (the machine-rate fit reads every run name)
    from vitkit.reproduce.estimate import arm_of
    assert arm_of("gap-lr1e-2@x4", arms) == arms["gap-lr1e-2"].at(1e-2, 4.0)


def test_the_mpp_parent_keeps_a_curve_and_a_failing_parent_gates_its_fine_tune(tmp_path):
    b = get_budget("full")
    arms = arms_table()
    assert runs.recipe_overrides(arms["mpp"], 0, b, tmp_path)["train.eval_every"] > 0  # v3: a curve
    assert runs.recipe_overrides(arms["mpp"], 0, get_budget("full", version=2), tmp_path)["train.eval_every"] == 0
    from vitkit.reproduce.measure import learning_curve
    rows = [{"kind": "eval", "split": "val", "epoch": e, "mpp_acc": 0.3 + 0.01 * e, "mpp_loss": 1.0} for e in (1, 2)]
    rows.append({"kind": "eval", "split": "val", "epoch": 2, "final": True, "mpp_acc": 0.9})  # exported weights
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = learning_curve(tmp_path, "mpp_acc")
    assert [e for e, _ in got] == [1, 2] and [a for _, a in got] == pytest.approx([0.31, 0.32])
    prereg = rule.load_plan()
    b = b.with_(seeds=tuple(range(6)))
    claims, arms, names = catalog_plan([8], b)
    assert "mpp" in names

    def build(mpp_gain):
        ms = {}
        for n in names:
            f = {"few-mpp": 0.80, "few-scratch": 0.75}.get(n)
            rise = mpp_gain if n == "mpp" else 0.0
            k = 7 if n == "few-mpp" else 5
            ms[n] = [{"seed": s, "test_top1": f and f + 0.002 * ((s * k) % 3), "val_top1": f, "code": None,
                      "plan": prereg["sha256"], "params": 1, "macs": 1, "train_macs": 1,
                      "curve": [[e, 0.5 - rise * max(0, 11 - e) / 11] for e in range(12)]} for s in b.seeds]
        sweeps = {arms[n].family: {"lr": 2e-3, "edge": None, "val_top1": {}} for n in names if arms[n].lr is None}
        return report.build(claims, arms, {n: n for n in arms}, ms, b, plan=prereg, sweeps=sweeps)
    ok = build(0.0)
    assert ok["arm_checks"]["mpp"]["failed"] == [] and ok["claims"][0]["verdict"] == stats.REPRODUCED
    bad = build(0.05)  # MPP still gaining 5 points of patch accuracy at its end
    assert bad["arm_checks"]["mpp"]["failed"][0].startswith("not converged")
    assert "its parent mpp failed the checks" in bad["arm_checks"]["few-mpp"]["failed"]
    assert bad["claims"][0]["verdict"] == verdict.NO_VERDICT and "few-mpp" in bad["claims"][0]["tests"][0]["note"]


def test_claim5_fine_tunes_must_at_least_match_their_parent():
    """Each of claim 5's fine-tunes is checked against its parent's validation accuracy at the parent's
    resolution (20 px): one more than the noise below it cannot carry a verdict, and the report prints the
    check."""
    from vitkit.reproduce import markdown
    prereg = rule.load_plan()
    b = get_budget("full").with_(seeds=tuple(range(6)))
    claims, arms, names = catalog_plan([5], b)
    n_val = 5000
    se = math.sqrt(0.85 * 0.15 / n_val)

    def build(ft20_gap):
        base = {"res-pre20": 0.85, "res-ft20": 0.85 + ft20_gap, "res-ft28": 0.88, "res-ft28-reinit": 0.86}
        ms = {}
        for i, n in enumerate(names):
            f = base[n]
            ms[n] = [{"seed": s, "test_top1": f + 0.002 * ((s * (i + 3)) % 3), "val_top1": f + 0.001 * (s % 2),
                      "code": None, "plan": prereg["sha256"], "params": 1, "macs": 1,
                      "curve": [[e, f] for e in range(12)]} for s in b.seeds]
        sweeps = {arms[n].family: {"lr": 2e-3, "edge": None, "val_top1": {}} for n in names if arms[n].lr is None}
        return report.build(claims, arms, {n: n for n in arms}, ms, b, plan=prereg, sweeps=sweeps)
    ok = build(-1.5 * se)  # below its parent, but within 2 standard errors: it matches
    chk = ok["arm_checks"]
    assert chk["res-ft20"]["parent_check"]["ok"] and chk["res-ft28"]["parent_check"]["ok"]
    assert chk["res-ft20"]["parent_check"]["gap"] == pytest.approx(-1.5 * se, abs=1e-9)
    assert chk["res-ft20"]["parent_check"]["parent_img_size"] == 20
    assert "parent_check" not in chk["res-pre20"] and ok["claims"][0]["verdict"] == stats.REPRODUCED
    bad = build(-2.5 * se)
    assert not bad["arm_checks"]["res-ft20"]["parent_check"]["ok"]
    failed = bad["arm_checks"]["res-ft20"]["failed"]
    assert any(f.startswith("below its parent res-pre20 on validation") for f in failed)
    assert bad["claims"][0]["verdict"] == verdict.NO_VERDICT and "res-ft20" in bad["claims"][0]["tests"][0]["note"]
    lines = markdown.arm_check_lines(bad)
    assert any(x.startswith("**Fine-tunes against their parent**") for x in lines)
    row = next(x for x in lines if x.startswith("| res-ft20 | res-pre20 (20 px) | 6 |"))
    assert row.endswith("| no |") and f"{100 * -2.5 * se:+.2f}" in row
    # claim 10's fine-tunes learn other classes than their parents: no such check
    xarms = arms_table()
    assert convergence.parent_check("xfer-ft-vit", xarms, {"xfer-ft-vit": {"val_top1": {"0": 0.5}},
                                                           "xfer-vit": {"val_top1": {"0": 0.9}}}, n_val) is None


def test_a_fixed_arm_that_is_a_swept_point_trains_once():
    """Claim 2's GAP arm at 1e-3 is the base ViT's sweep point at 1e-3: the sweep trains it once, under the
    name the report resolves both arms to, and both families read its measures."""
    arms = arms_table()
    b = get_budget("full").with_(lr_sweep=(1e-3, 2e-3, 4e-3), sweep_seeds=(0, 1))
    names = catalog_plan([1, 2], b)[2]
    fams = sweep.families(names, arms, fixed=True)
    log = []
    conv = lambda ms: convergence.converged_runs(ms, 5000)  # noqa: E731
    chosen, measured = sweep.grow(fams, arms, b, _fixed_train({}, log), conv)
    trained = [n for r in log for n in r]
    assert "vit@lr1e-3" in trained and "gap-lr1e-3" not in trained and "gap-lr1e-2" in trained
    assert chosen["gap-lr1e-3"]["converged"] and "gap-lr1e-3" not in measured
    assert sweep.twins({"gap-lr1e-3": arms["gap-lr1e-3"], "vit@lr1e-3": arms["vit"].at_lr(1e-3)}, arms) == {
        "gap-lr1e-3": "vit@lr1e-3"}
    _, alias = sweep.resolve(arms, {**chosen, "vit": {**chosen["vit"], "lr": 1e-3, "stretch": 1.0}})
    assert alias["gap-lr1e-3"] == alias["vit"] == "vit@lr1e-3"  # the run the sweep trained
