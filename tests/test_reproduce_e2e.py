"""vitkit reproduce end to end on a tiny synthetic data set, as the pilot (the quick budget) runs it under the
analysis plan: what each primary can show said before training, the grown sweep, a validation curve for every
arm, the arm checks, the verdicts re-derived from report.json alone, the pilot's spreads and the full budget's
design, claim 7's speed timed once in the campaign and read back (never re-timed) by a second rendering."""
import json

import numpy as np
import pytest
from scipy import stats as sps

from test_reproduce import tiny_budget, tiny_data  # noqa: F401 (a fixture)
from vitkit.reproduce import measure, reproduce, rule, runs, verdict
from vitkit.reproduce.catalog import arms_table


def _rederive_primaries(saved):
    """The primaries' one-sided p-values (scipy) and Holm (by hand) from report.json's per-seed values."""
    prim = [t for c in saved["claims"] for t in c["tests"] if t.get("role") == "primary" and "p_one_sided" in t
            and t["p_one_sided"] is not None]
    ps = []
    for t in prim:
        d = np.array(list(rule.per_seed(t, saved["values"]).values()))
        ps.append(sps.ttest_1samp(d, t["ref"], alternative="greater").pvalue if t["expect"] == ">"
                  else t["p_one_sided"])
    m, run, out = len(ps), 0.0, [0.0] * len(ps)
    for j, i in enumerate(np.argsort(ps)):
        run = max(run, min(1.0, ps[i] * (m - j)))
        out[i] = run
    return prim, ps, out


@pytest.mark.slow
def test_the_pilot_end_to_end_tiny(tmp_path, tiny_data, monkeypatch):  # noqa: F811
    out = tmp_path / "rep"
    # two rates and one extension past an end, schedules doubled once at most; 2 epochs (8 steps, 8 evaluations)
    budget = tiny_budget(tiny_data).with_(lr_sweep=(1e-3, 3e-3), grid_extensions=1, max_stretch=2.0, epochs=2,
                                          finetune_epochs=2, few_label_epochs=2)
    ids = [2, 5, 7, 8, 9, 10]  # selection, fine-tuning, speed, MPP, analysis at init, transfer
    lines = []
    reproduce(out, ids, budget, command="test", log=lines.append)
    saved = json.loads((out / "report.json").read_text())
    sha = rule.load_plan()["sha256"]
    assert [c["id"] for c in saved["claims"]] == ids and saved["version"] == 3 and saved["plan"]["sha256"] == sha
    assert set(saved["plans"].values()) == {sha}  # every run recorded the plan it was started under
    # before anything trained: what each primary can show at this budget
    first_train = next(i for i, x in enumerate(lines) if "learning-rate sweep" in x)
    said = [x for x in lines[:first_train] if x.strip().startswith("claim")]
    assert len(said) == len(ids) and all("MDE" in x for x in said), lines[:first_train]
    assert saved["test"].startswith("40 test images")
    for c in saved["claims"]:
        assert c["verdict"] in verdict.VERDICTS and (out / f"claim{c['id']}.png").is_file()
    # a validation curve for every arm that classifies, fine-tunes included, at every seed
    arms = arms_table(budget.data_sizes)
    trained = [n for n in saved["values"] if n in arms and arms[n].kind == "train" and saved["values"][n]]
    assert {"res-ft28", "res-ft20", "few-mpp", "xfer-ft-vit"} <= set(trained)
    for n in trained:
        assert sorted(saved["curves"][n]) == ["0", "1"] and all(len(cv) >= 5 for cv in saved["curves"][n].values())
        assert n in saved["arm_checks"], n
    # the sweep: vit's grid grew past the end its best rate sat at; the choice is the best mean on validation
    s = saved["sweeps"]["vit"]
    assert s["extended"] == 1 and len(s["grid"]) == 3
    val = {lr: sum(v) / len(v) for lr, v in s["val_top1"].items()}
    assert val[f"{s['lr']:g}"] == max(val.values())
    assert saved["sweeps"]["res-ft28"]["grid"] == [5e-4]  # fine-tunes: their own (fine-tuning) rates
    # one rate is never an interior rate: the pilot's fine-tunes cannot carry a verdict, and the report says why
    c5 = next(c for c in saved["claims"] if c["id"] == 5)
    assert c5["verdict"] == verdict.NO_VERDICT and "single rate" in c5["tests"][0]["note"]
    # the primaries' Holm family, re-derived from report.json alone
    prim, ps, holm = _rederive_primaries(saved)
    assert prim and saved["tests_in_family"] == len(prim)
    for t, p, q in zip(prim, ps, holm):
        assert t["p_one_sided"] == pytest.approx(p, rel=1e-6) and t["p_adjusted"]["primary"] == pytest.approx(q)
    # the pilot ends with its spreads and the full budget's design
    pil = saved["pilot"]
    assert set(pil["design"]["claims"]) == {str(i) for i in ids} and pil["spreads"]
    assert any("the full budget needs" in x for x in lines)
    # the honest wording, from this run's own report.json: one sentence a claim, naming its scale and verdict
    from vitkit.reproduce import wording
    said = wording.claim_sentences(saved)
    assert sorted(said) == ids and all(f": {c['verdict']}.** On " in said[c["id"]] for c in saved["claims"])
    assert "carries no verdict because an arm failed" in said[5]  # the pilot's single-rate fine-tunes
    # claim 7's speed: timed once, 30 rounds, stored with the seed-0 run
    c7 = next(c for c in saved["claims"] if c["id"] == 7)
    t = next(t for t in c7["tests"] if t.get("metric") == "paired_img_per_s")
    assert t["design"] == "paired" and t["n"] == 30 and t["role"] == "secondary"
    stored = list((out / "runs").glob(f"*/seed0/{measure.SPEED_FILE}"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["rounds"] == 30
    # provenance: one code version
    from vitkit.reproduce.measure import code_id, code_version
    assert saved["compute"]["code_versions"] == {code_id(code_version()): saved["compute"]["runs"]}
    # claim 10: pre-trained on the even classes, fine-tuned on the odd ones
    c10 = next(c for c in saved["claims"] if c["id"] == 10)
    from vitkit.train import load_recipe
    ft = load_recipe(runs.run_folder(out, c10["arms"][1]["run"], 0) / "recipe.yaml")
    assert ft.data.dataset.endswith("-odd-classes.npz")
    # a second call trains nothing and times nothing, also after the folder moved: the same verdicts, speed too
    monkeypatch.setattr(measure, "paired_speed", lambda *a, **k: pytest.fail("re-timed at report time"))
    again = []
    out = out.rename(tmp_path / "moved")
    rep2 = reproduce(out, ids, budget, command="test", log=again.append)
    assert not any("training" in x or "resumed" in x for x in again)
    assert [[t["verdict"] for t in c["tests"]] for c in rep2["claims"]] == \
           [[t["verdict"] for t in c["tests"]] for c in saved["claims"]]
    from vitkit.cli import main
    assert main(["reproduce", "--claims", "8,11", "--report-only", "--out", str(out)]) == 2  # a usage error
