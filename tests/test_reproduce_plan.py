"""vitkit reproduce v3: the pre-registered plan and its power analysis. Power and MDE against simulation,
Holm over the primary hypotheses only, intervals at the level the verdict used, the plan hash that freezes
the plan after the first run, and claims declared not testable before anything trains."""
import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from vitkit.errors import ConfigError
from vitkit.reproduce import campaign, report, rule, stats, verdict
from vitkit.reproduce.budget import get_budget
from vitkit.reproduce.catalog import plan as catalog_plan

SIMS = 4000  # rejection rates within about 4 binomial SEs (0.025 near 0.8) of the formula's


def _sim_one_sided(effect, sd, n, level, rng):
    d = rng.normal(effect, sd, size=(SIMS, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    return float(np.mean(t > sps.t.ppf(1 - level, n - 1)))


def _sim_tost(margin, sd, n, level, rng):
    d = rng.normal(0.0, sd, size=(SIMS, n))
    h = sps.t.ppf(1 - level, n - 1) * d.std(1, ddof=1) / math.sqrt(n)
    return float(np.mean((d.mean(1) - h > -margin) & (d.mean(1) + h < margin)))


@pytest.mark.parametrize("effect,sd,n,level", [(1.2, 1.0, 6, 0.05 / 3), (0.02, 0.015, 10, 0.05 / 8)])
def test_one_sided_power_matches_simulation(effect, sd, n, level):
    rng = np.random.default_rng(0)
    got = stats.power(effect, sd, n, level, ">")
    assert got == pytest.approx(_sim_one_sided(effect, sd, n, level, rng), abs=0.025)
    # a normal approximation (z instead of the noncentral t) is off by far more at these seed counts
    z = sps.norm.sf(sps.norm.ppf(1 - level) - effect / (sd / math.sqrt(n)))
    assert abs(z - got) > 0.05


def test_equivalence_power_matches_simulation():
    rng = np.random.default_rng(1)
    got = stats.power(1.2, 1.0, 8, 0.05, "~")
    assert got == pytest.approx(_sim_tost(1.2, 1.0, 8, 0.05, rng), abs=0.025)
    assert 0.2 < got < 0.9  # a point where a wrong formula shows


def test_mde_is_the_effect_with_the_target_power():
    rng = np.random.default_rng(2)
    for expect, sim in ((">", _sim_one_sided), ("~", _sim_tost)):
        m = stats.mde(1.0, 7, 0.01, expect, 0.8)
        assert stats.power(m, 1.0, 7, 0.01, expect) == pytest.approx(0.8, abs=1e-6)
        assert sim(m, 1.0, 7, 0.01, rng) == pytest.approx(0.8, abs=0.025)
    # more seeds, smaller MDE; seeds_for returns the fewest seeds that reach the target
    assert stats.mde(1.0, 12, 0.01) < stats.mde(1.0, 7, 0.01)
    n = stats.seeds_for(1.5, 1.0, 0.01, ">", 0.8, 5, 20)
    assert stats.power(1.5, 1.0, n, 0.01) >= 0.8 > stats.power(1.5, 1.0, n - 1, 0.01)
    assert stats.seeds_for(0.1, 1.0, 0.01, ">", 0.8, 5, 20) is None


def _measures(names, values, plan_sha, seeds=range(6), rising=()):
    """Fake measures of every arm: ``values[arm](seed)`` as every accuracy metric, with a flat validation
    curve of 12 points (one still rising 2 points over its last 4 for the arms in ``rising``)."""
    out = {}
    for n in names:
        f = values.get(n, lambda s: 0.8 + 0.003 * ((s * 7) % 5))
        out[n] = [{"seed": s, "test_top1": f(s), "fewshot_5": f(s), "val_top1": f(s), "code": None,
                   "plan": plan_sha, "params": 1, "macs": 1,
                   "curve": [[e / 4, f(s) - (0.005 * max(0, 12 - e) if n in rising else 0.0)] for e in range(1, 13)]}
                  for s in seeds]
    return out


def _build(ids, values, prereg, budget=None, runs_plan=None, rising=(), edges=None, **kw):
    budget = budget or get_budget("full").with_(seeds=tuple(range(6)))
    claims, arms, names = catalog_plan(ids, budget)
    alias = {n: n for n in arms}
    ms = _measures(names, values, prereg["sha256"] if runs_plan is None else runs_plan, rising=rising)
    sweeps = {arms[n].family: {"lr": 2e-3, "edge": (edges or {}).get(arms[n].family), "val_top1": {}}
              for n in names if arms[n].lr is None}
    return report.build(claims, arms, alias, ms, budget, plan=prereg, sweeps=sweeps, **kw)


def test_holm_runs_over_the_primaries_only_and_intervals_use_the_verdicts_level():
    prereg = rule.load_plan()
    noise = {s: 0.004 * ((s * 5) % 3 - 1) for s in range(6)}
    values = {"vit": lambda s: 0.85 + noise[s], "pe-none": lambda s: 0.80 + 0.5 * noise[s],  # claim 1: clear
              "vit-p7": lambda s: 0.845 + 0.3 * noise[s] + 0.002 * (s % 2),  # claim 6: marginal
              "pe-2d": lambda s: 0.851 + noise[s]}
    rep = _build([1, 6], values, prereg)
    prim = [t for c in rep["claims"] for t in c["tests"] if t["role"] == "primary"]
    sec = [t for c in rep["claims"] for t in c["tests"] if t["role"] == "secondary"]
    assert len(prim) == 2 and len(sec) > 4 and rep["tests_in_family"] == 2
    # Holm by hand over the primaries' one-sided paired t p-values
    ps = []
    for t in prim:
        d = np.array(list(rule.per_seed(t, rep["values"]).values()))
        ps.append(sps.ttest_1samp(d, 0.0, alternative="greater").pvalue)
    order = np.argsort(ps)
    holm = [0.0, 0.0]
    run = 0.0
    for j, i in enumerate(order):
        run = max(run, min(1.0, ps[i] * (2 - j)))
        holm[i] = run
    for t, p, q in zip(prim, ps, holm):
        assert t["p_one_sided"] == pytest.approx(p, rel=1e-6) and t["p_adjusted"]["primary"] == pytest.approx(q)
        # the interval is the one at Holm's level for this hypothesis, and agrees with the verdict
        a = t["level"]
        h = sps.t.ppf(1 - a, t["df"]) * t["se"]
        assert t["ci"] == pytest.approx([t["estimate"] - h, t["estimate"] + h]) and t["ci_level"] == pytest.approx(
            1 - 2 * a)
        assert (t["ci"][0] > 0) == (t["verdict"] == stats.REPRODUCED)
    assert sorted(t["level"] for t in prim) == pytest.approx([0.025, 0.05])  # claim 1 rejected at step 1
    # secondaries: unadjusted p-values and a 95% interval, never in the family
    for t in sec:
        if "p_values" in t:
            assert t["p_adjusted"] == t["p_values"] and t["ci_level"] == 0.95
    # claim 1 (a 5-point gain at a 0.4-point spread) is reproduced whatever its secondaries say
    assert rep["claims"][0]["verdict"] == stats.REPRODUCED


def test_the_report_refuses_a_plan_changed_after_the_first_run():
    prereg = rule.load_plan()
    with pytest.raises(ConfigError, match="analysis plan changed after the campaign's first run"):
        _build([8], {}, prereg, runs_plan="0" * 64)
    # a design made under another plan is refused too
    with pytest.raises(ConfigError, match="another analysis plan"):
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "runs").mkdir()
            (Path(d) / "runs" / "design.json").write_text(json.dumps({"plan": "f" * 64}))
            campaign.load_or_make(Path(d), lambda: {}, prereg["sha256"])


def test_a_changed_plan_file_has_another_hash(tmp_path):
    prereg = json.loads(rule.PLAN.read_text())
    prereg["primary"]["1"]["effect"] = 0.01
    other = tmp_path / "plan.json"
    other.write_text(json.dumps(prereg))
    assert rule.load_plan(other)["sha256"] != rule.load_plan()["sha256"]
    prereg["primary"]["1"]["test"] = "no such test"
    other.write_text(json.dumps(prereg))
    with pytest.raises(ConfigError, match="is not one of its tests"):
        rule.load_plan(other)


def test_plan_seeds_declares_what_cannot_be_powered_and_gives_its_compute_away():
    prim = {1: {"expect": ">", "effect": 0.02}, 2: {"expect": ">", "effect": 0.02}, 3: {"expect": ">", "effect": 0.02}}
    sds = {1: 0.01, 2: 0.05, 3: None}  # 2 needs more than 20 seeds; 3 has no spread estimate
    arms_of = {1: ["a"], 2: ["b"], 3: ["c"]}
    got = campaign.plan_seeds(prim, sds, arms_of, {"a": 1.0, "b": 1.0, "c": 1.0}, budget_s=12.0)
    c = got["claims"]
    assert c[1]["testable"] and not c[2]["testable"] and not c[3]["testable"]
    assert "more than 20 seeds" in c[2]["reason"] and c[2]["mde"] > 0.02 and c[2]["power"] < 0.8
    # claim 1 is tested alone: at alpha (m = 1), and gets every second left (12 seeds)
    assert got["level"] == 0.05 and c[1]["seeds"] == 12 and c[1]["power"] >= 0.8
    assert got["arms"] == {"a": 12}
    # a budget too small for both testable claims drops the one that frees the most compute
    got = campaign.plan_seeds({1: prim[1], 4: prim[1]}, {1: 0.01, 4: 0.01}, {1: ["a"], 4: ["d", "e"]},
                              {"a": 1.0, "d": 1.0, "e": 1.0}, budget_s=12.0)
    assert got["claims"][4]["testable"] is False and "do not fit the budget" in got["claims"][4]["reason"]


def test_plan_seeds_drops_short_claims_one_at_a_time_so_a_smaller_family_keeps_what_fits():
    """Claim 2 is short at alpha/3 but reaches 80% at alpha/2 once hopeless claim 3 has left the family;
    dropping every short claim at once would lose it."""
    from vitkit.reproduce import stats as P

    prim = {c: {"expect": ">", "effect": 0.02} for c in (1, 2, 3)}
    sd2 = next(s / 1e4 for s in range(50, 400)
               if P.power(0.02, s / 1e4, 20, 0.05 / 3) < 0.8 <= P.power(0.02, s / 1e4, 20, 0.05 / 2))
    sds = {1: 0.005, 2: sd2, 3: 0.2}
    got = campaign.plan_seeds(prim, sds, {c: [str(c)] for c in prim}, {"1": 1.0, "2": 1.0, "3": 1.0}, budget_s=1e6)
    c = got["claims"]
    assert got["testable"] == [1, 2] and got["level"] == 0.05 / 2
    assert c[2]["testable"] and c[2]["seeds"] == 20 and c[2]["power"] >= 0.8
    # claim 3 left a family of three: its reason, MDE and power are at that level, and the MDE exceeds its effect
    assert not c[3]["testable"] and c[3]["level"] == 0.05 / 3 and "one of 3 primaries" in c[3]["reason"]
    assert c[3]["mde"] > 0.02 and c[3]["power"] == pytest.approx(P.power(0.02, 0.2, 20, 0.05 / 3))
    # claim 3 powered but too dear: once it leaves for the budget, claim 2 (left out for power in a family of
    # three) is tried again in the family of two, and fits
    sds = {1: 0.005, 2: sd2, 3: 0.005}
    got = campaign.plan_seeds(prim, sds, {c: [str(c)] for c in prim}, {"1": 1.0, "2": 1.0, "3": 1000.0},
                              budget_s=100.0)
    c = got["claims"]
    assert got["testable"] == [1, 2] and c[2]["testable"] and c[2]["power"] >= 0.8
    assert not c[3]["testable"] and "do not fit the budget" in c[3]["reason"]


def test_not_testable_claims_are_declared_before_anything_trains(tmp_path):
    """The full budget's design is written before the first run: the claims it cannot power are named there,
    with their MDE, and their arms are not trained."""
    prereg = rule.load_plan()
    budget = get_budget("full").with_(hours=12.0, plan_sha=prereg["sha256"])
    claims, arms, names = catalog_plan(None, budget)
    lines = []
    kept, design, seeds = campaign.before_training(prereg, claims, arms, names, budget, tmp_path, None, 2,
                                                   lines.append, restore=lambda: None)
    saved = json.loads((tmp_path / "runs" / "design.json").read_text())
    assert saved == json.loads(json.dumps(design)) and list((tmp_path / "runs").iterdir()) == [
        tmp_path / "runs" / "design.json"]
    off = [int(c) for c, r in design["claims"].items() if not r["testable"]]
    on = [int(c) for c, r in design["claims"].items() if r["testable"]]
    assert off and on, design["claims"]
    for c in off:
        r = design["claims"][str(c)]
        assert r["reason"] and (r["mde"] is None or r["mde"] > 0)
        assert any(line.strip().startswith(f"claim {c:>2}: not testable at this budget") for line in lines)
    for c in on:
        assert design["claims"][str(c)]["power"] >= 0.8
    only_off = {a for c in claims if c.id in off for a in rule.claim_arms(c, arms)} - \
        {a for c in claims if c.id in on for a in rule.claim_arms(c, arms)}
    assert only_off and not only_off & set(kept)
    assert all(len(seeds[a]) == design["arms"].get(a, len(seeds[a])) for a in kept)
    # the design is reused, not remade, when the campaign resumes
    again = campaign.before_training(prereg, claims, arms, names, budget.with_(hours=50.0), tmp_path, None, 2,
                                     lines.append, restore=lambda: None)[1]
    assert again == design


def test_a_not_testable_claim_carries_that_verdict_and_no_p_value():
    prereg = rule.load_plan()
    design = {"claims": {"8": {"testable": False, "reason": "needs more than 20 seeds for 80% power", "mde": 0.05,
                               "power": 0.3, "seeds": 20}}}
    rep = _build([1, 8], {"vit": lambda s: 0.9}, prereg, design=design)
    c8 = next(c for c in rep["claims"] if c["id"] == 8)
    assert c8["verdict"] == verdict.NOT_TESTABLE and rep["tests_in_family"] == 1
    assert c8["tests"][0]["mde"] == 0.05


def test_holm_levels_by_hand():
    # p sorted 0.001 < 0.02 < 0.03 at alpha 0.05: step 1 at 0.05/3 rejects, step 2 at 0.025 rejects, step 3 at
    # 0.05 rejects
    assert verdict.holm_levels([0.03, 0.001, 0.02], 0.05) == pytest.approx([0.05, 0.05 / 3, 0.025])
    # stopping at step 2: the rest take that step's level
    assert verdict.holm_levels([0.04, 0.001, 0.03], 0.05) == pytest.approx([0.025, 0.05 / 3, 0.025])


def test_an_arm_not_converged_or_at_an_edge_rate_cannot_carry_a_verdict():
    prereg = rule.load_plan()
    values = {"vit": lambda s: 0.85 + 0.003 * ((s * 5) % 3), "pe-none": lambda s: 0.80 + 0.001 * s,
              "vit-p7": lambda s: 0.80 + 0.001 * s}
    ok = _build([1, 6], values, prereg)
    assert [c["verdict"] for c in ok["claims"]] == [stats.REPRODUCED, stats.REPRODUCED]
    assert ok["arm_checks"]["vit"]["failed"] == [] and ok["arm_checks"]["vit"]["rate"] == "interior"
    rep = _build([1, 6], values, prereg, rising=("pe-none",), edges={"vit-p7": "largest"})
    c1, c6 = rep["claims"]
    assert c1["verdict"] == verdict.NO_VERDICT and "pe-none (not converged" in c1["tests"][0]["note"]
    assert c6["verdict"] == verdict.NO_VERDICT and "vit-p7 (rate at the largest end" in c6["tests"][0]["note"]
    assert rep["arm_checks"]["pe-none"]["convergence"]["gain"] == pytest.approx(0.02)
    # the Holm family is unchanged by the gate: the verdict is withheld, the p-value still counted
    assert rep["tests_in_family"] == ok["tests_in_family"] == 2


def test_the_report_lists_the_arms_that_fail_the_checks(tmp_path):
    prereg = rule.load_plan()
    rep = _build([1], {"vit": lambda s: 0.85 + 0.003 * ((s * 5) % 3)}, prereg, rising=("pe-none",))
    from vitkit.reproduce import markdown
    lines = markdown.arm_check_lines(rep)
    n = len(rep["arm_checks"])
    assert f"{n - 1} of {n} arms converged" in lines[1]
    assert any(x.startswith("| pe-none | interior | not converged: still gaining 2.00 pt") for x in lines)


def test_the_design_is_priced_again_at_the_schedules_the_sweep_chose():
    from vitkit.reproduce import sweep
    prereg = rule.load_plan()
    b = get_budget("full")
    claims, arms, names = catalog_plan([6], b)
    sds = rule.planning_sds([rule.prior_spreads(prereg)], prereg)
    d = campaign.make_design(prereg, claims, arms, b, sds, 1e-10, 0.0, 2)
    assert d["arms"]
    got = {}
    for k in (1.0, 2.0):
        runs_, alias = sweep.resolve(arms, {f: {"lr": 2e-3, "stretch": k} for f in sweep.families(names, arms)})
        seeds = {alias[a]: list(range(n)) for a, n in d["arms"].items()}
        got[k] = campaign.priced_after_sweep(d, runs_, seeds, b)
    assert got[1.0]["now_h"] == pytest.approx(got[1.0]["planned_h"], rel=1e-9)
    # twice the training, the same evaluations: a little under twice the hours
    assert 1.8 * got[1.0]["now_h"] < got[2.0]["now_h"] < 2.0 * got[1.0]["now_h"]


def test_the_machine_rate_is_fitted_to_a_v3_pilot_and_a_grown_sweep():
    """The pilot's fine-tunes run at fine-tuning rates, a grown sweep at rates and schedules off the starting
    grid: every run name is still read as its arm (the pilot's design is fitted to its own machine)."""
    from vitkit.reproduce.estimate import arm_macs, fit, passes, run_list
    from vitkit.reproduce.sweep import resolve
    b = get_budget("quick")
    rate, overhead, jobs = 2.5e-10, 7.0, 2
    listed = list(run_list(b))
    assert any(a.name == "res-ft28@lr5e-4" for a, _ in listed)
    extra = resolve(catalog_plan(None, b)[1], {"vit": {"lr": 1.6e-2, "stretch": 2.0}})[0]["vit@lr1.6e-2-x2"]
    train_s, total, n = {}, 0.0, 0
    for arm, k in listed + [(extra, 1)]:
        seen, ev = passes(arm, b)
        t = rate * 3 * arm_macs(arm) * seen
        seeds = train_s.setdefault(arm.name, {})
        seeds.update({str(len(seeds) + i): t for i in range(k)})
        total += k * (t + rate * arm_macs(arm) * ev + overhead)
        n += k
    report = {"budget": "quick", "version": 3, "compute": {"complete": True, "train_s": train_s,
                                                           "wall_s": total / jobs, "jobs": jobs, "runs": n}}
    r, o = fit(report)
    assert r == pytest.approx(rate, rel=1e-9) and o == pytest.approx(overhead, rel=1e-6)
