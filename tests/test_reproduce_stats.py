"""vitkit reproduce's statistics: each branch of the verdict rule on constructed data, paired vs Welch
contrasts, TOST, Holm, seeds never dropped silently, and every verdict of a report re-derived from its
per-seed values alone with an independent implementation."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from vitkit.reproduce import stats

S = stats


def test_summary_gives_a_t_interval():
    s = S.summary([0.80, 0.82, 0.84])
    assert s["mean"] == pytest.approx(0.82) and s["std"] == pytest.approx(0.02) and s["n"] == 3
    h = sps.t.ppf(0.975, 2) * 0.02 / math.sqrt(3)
    assert s["ci"] == pytest.approx([0.82 - h, 0.82 + h])
    assert S.summary([0.8])["ci"] is None and S.summary([])["mean"] is None


def test_contrast_is_paired_by_seed_when_the_seeds_agree():
    a = {0: 0.80, 1: 0.90, 2: 0.70, 3: 0.85}
    b = {s: v - 0.01 for s, v in a.items()}  # 1 point below in every seed, seeds far apart
    c = S.contrast([("a", 1.0), ("b", -1.0)], {"a": a, "b": b})
    assert c["design"] == "paired" and c["df"] == 3 and c["estimate"] == pytest.approx(0.01)
    assert c["se"] == pytest.approx(0.0, abs=1e-12)
    res = sps.ttest_rel(list(a.values()), [v + 1e-9 * s for s, v in b.items()])  # scipy on the same pairs
    assert res.statistic > 100
    # unpaired (Welch) the seed spread swamps the 1-point difference
    w = S.contrast([("a", 1.0), ("b", -1.0)], {"a": a, "b": {s + 10: v for s, v in b.items()}}, allow_missing=True)
    assert w["design"] == "welch"
    ref = sps.ttest_ind(list(a.values()), list(b.values()), equal_var=False)
    assert w["estimate"] / w["se"] == pytest.approx(ref.statistic)
    assert w["df"] == pytest.approx(ref.df)


def test_missing_seeds_are_an_error_unless_allowed():
    vals = {"a": {0: 0.8, 1: 0.82, 2: 0.81}, "b": {0: 0.7, 1: 0.71}}
    with pytest.raises(S.SeedMismatch, match=r"b: \[2\]"):
        S.contrast([("a", 1.0), ("b", -1.0)], vals)
    c = S.contrast([("a", 1.0), ("b", -1.0)], vals, allow_missing=True)
    assert c["design"] == "welch" and c["missing_seeds"] == {"b": [2]}


def test_holm_matches_the_textbook_example():
    p = [0.01, 0.04, 0.03, 0.005]
    assert S.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert S.holm([]) == []


def _verdict(values_a, values_b, expect=">", margin=0.01, family=1):
    c = S.contrast([("a", 1.0), ("b", -1.0)], {"a": dict(enumerate(values_a)), "b": dict(enumerate(values_b))})
    p = S.p_values(c, expect, 0.0, margin)
    adj = {k: min(1.0, v * family) for k, v in p.items()}  # a family of `family` tests of equal p
    return S.decide(expect, c["estimate"], 0.0, adj)


base = [0.80, 0.83, 0.78, 0.81, 0.79]
jitter = [0.001, -0.002, 0.0015, -0.001, 0.0005]


@pytest.mark.parametrize("a,b,expect,want", [
    ([v + 0.03 + j for v, j in zip(base, jitter)], base, ">", S.REPRODUCED),      # +3 pt in every seed
    ([v - 0.03 + j for v, j in zip(base, jitter)], base, ">", S.CONTRADICTED),    # -3 pt in every seed
    ([v + j for v, j in zip(base, jitter)], base, ">", S.RULED_OUT),              # 0 +- 0.1 pt: a 1 pt effect excluded
    ([v + 0.02 * s for v, s in zip(base, [1, -1, 1, -1, 0.5])], base, ">", S.UNDERPOWERED),  # noisy
    ([v + j for v, j in zip(base, jitter)], base, "~", S.REPRODUCED),              # within 1 pt, tightly
    ([v + 0.05 + j for v, j in zip(base, jitter)], base, "~", S.CONTRADICTED),     # 5 pt apart
    ([v + 0.03 * s for v, s in zip(base, [1, -1, 1, -1, 0.5])], base, "~", S.UNDERPOWERED),
])
def test_each_branch_of_the_verdict_rule(a, b, expect, want):
    assert _verdict(a, b, expect) == want


def test_the_correction_can_turn_a_finding_into_underpowered():
    a = [v + 0.006 + 0.004 * s for v, s in zip(base, [1, -1, 0.5, 0, -0.5])]
    assert _verdict(a, base) == S.REPRODUCED
    assert _verdict(a, base, family=30) == S.UNDERPOWERED


def test_one_seed_or_identical_seeds_are_underpowered_and_add_no_p_value():
    c = S.contrast([("a", 1.0), ("b", -1.0)], {"a": {0: 0.9}, "b": {0: 0.8}})
    assert S.p_values(c, ">", 0.0, 0.01) == {}
    assert S.decide(">", c["estimate"], 0.0, {}) == S.UNDERPOWERED
    same = S.contrast([("a", 1.0), ("b", -1.0)], {"a": {0: 0.5, 1: 0.5}, "b": {0: 0.5, 1: 0.5}})
    assert same["se"] == 0 and S.p_values(same, ">", 0.0, 0.01) == {} and S.p_values(same, "~", 0.0, 0.01) == {}


def test_claim_verdicts_combine_conservatively():
    assert S.combine([S.REPRODUCED, S.REPRODUCED]) == S.REPRODUCED
    assert S.combine([S.REPRODUCED, S.UNDERPOWERED]) == S.UNDERPOWERED
    assert S.combine([S.REPRODUCED, S.RULED_OUT]) == S.RULED_OUT
    assert S.combine([S.RULED_OUT, S.CONTRADICTED]) == S.CONTRADICTED
    assert S.combine([]) == S.UNDERPOWERED


def test_rank_correlation():
    x = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    r = S.rank_correlation(x, [v + 0.01 for v in x])
    assert r["rho"] == pytest.approx(1.0) and S.decide_correlation(r["rho"], r["p"]) == S.REPRODUCED
    r = S.rank_correlation(x, [-v for v in x])
    assert S.decide_correlation(r["rho"], r["p"]) == S.CONTRADICTED
    assert S.rank_correlation(x[:2], x[:2])["rho"] is None


# --- re-deriving a report's verdicts from report.json alone ------------------------------------------------
def rederive(report):
    """An independent implementation of the rule in the report (scipy's t-tests, statsmodels-free Holm):
    every test's verdict from report["values"]."""
    values, fam = report["values"], []
    for c in report["claims"]:
        for t in c["tests"]:
            if t.get("kind") == "correlation":
                if t.get("p") is not None:
                    fam.append((t, "effect", t["p"]))
                continue
            if "error" in t or t.get("duplicate_of"):
                continue
            cols = [values[a][t["metric"]] for a, _ in t["weights"]]
            seeds = sorted(cols[0], key=int)
            assert all(sorted(c, key=int) == seeds for c in cols), "the report compared unpaired seeds"
            d = np.array([sum(w * values[a][t["metric"]][s] for a, w in t["weights"]) for s in seeds])
            if len(d) < 2:
                continue
            est, se, df = d.mean(), d.std(ddof=1) / math.sqrt(len(d)), len(d) - 1
            assert est == pytest.approx(t["estimate"])
            m, ref = t["margin"], t["ref"]
            if not se > 0:
                continue
            def tt(x, se=se):
                return x / se
            if t["expect"] == ">":
                fam.append((t, "effect", min(1.0, 2 * sps.t.sf(abs(tt(est - ref)), df))))
                if m is not None:
                    fam.append((t, "ruled_out", sps.t.cdf(tt(est - ref - m), df)))
            else:
                fam.append((t, "equivalent", max(sps.t.sf(tt(est - ref + m), df), sps.t.cdf(tt(est - ref - m), df))))
                fam.append((t, "beyond", sps.t.sf(tt(abs(est - ref) - m), df)))
    order = sorted(range(len(fam)), key=lambda i: fam[i][2])
    adj, run = {}, 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(fam) - rank) * fam[i][2]))
        adj[(id(fam[i][0]), fam[i][1])] = run
    out = {}
    for c in report["claims"]:
        for t in c["tests"]:
            sig = {k for (tid, k), p in adj.items() if tid == id(t) and p < report["alpha"]}
            if t.get("kind") == "correlation":
                v = S.UNDERPOWERED if "effect" not in sig else S.REPRODUCED if t["rho"] > 0 else S.CONTRADICTED
            elif "error" in t or t.get("duplicate_of") or t.get("note"):
                v = t["verdict"]  # an unmet precondition or a duplicate: checked by the report's own tests
            elif t["expect"] == "~":
                v = S.REPRODUCED if "equivalent" in sig else S.CONTRADICTED if "beyond" in sig else S.UNDERPOWERED
            elif "effect" in sig:
                v = S.REPRODUCED if t["estimate"] > t["ref"] else S.CONTRADICTED
            else:
                v = S.RULED_OUT if "ruled_out" in sig else S.UNDERPOWERED
            out[(c["id"], t["text"])] = v
    return out


def test_rederive_a_constructed_report():
    """report.evaluate on a constructed report.json agrees with the independent re-derivation."""
    from vitkit.reproduce import report as rep

    rng = np.random.default_rng(0)
    seeds = [str(s) for s in range(5)]
    arms = {"a": 0.85, "b": 0.80, "c": 0.851, "d": 0.70}
    values = {n: {"test_top1": {s: mu + float(rng.normal(0, 0.004)) for s in seeds}} for n, mu in arms.items()}
    values["c"]["test_top1"] = {s: v + 0.001 - j for (s, v), j in zip(values["a"]["test_top1"].items(), jitter)}
    values["e"] = {"test_top1": {s: v + j for (s, v), j in zip(values["a"]["test_top1"].items(), jitter)}}
    tests = [{"text": "a beats b", "kind": "contrast", "metric": "test_top1", "expect": ">", "ref": 0.0,
              "margin": 0.01, "weights": [["a", 1.0], ["b", -1.0]]},
             {"text": "c ~ a", "kind": "contrast", "metric": "test_top1", "expect": "~", "ref": 0.0, "margin": 0.01,
              "weights": [["c", 1.0], ["a", -1.0]]},
             {"text": "d beats a", "kind": "contrast", "metric": "test_top1", "expect": ">", "ref": 0.0,
              "margin": 0.01, "weights": [["d", 1.0], ["a", -1.0]]},
             {"text": "e beats a", "kind": "contrast", "metric": "test_top1", "expect": ">", "ref": 0.0,
              "margin": 0.01, "weights": [["e", 1.0], ["a", -1.0]]},
             {"text": "a beats c", "kind": "contrast", "metric": "test_top1", "expect": ">", "ref": 0.0,
              "margin": 0.01, "weights": [["a", 1.0], ["c", -1.0]]}]
    report = {"values": values, "code": {}, "alpha": 0.05, "claims": [{"id": 1, "tests": tests}]}
    rep.evaluate(report)
    got = {(1, t["text"]): t["verdict"] for t in tests}
    assert got == rederive(report)
    assert got == {(1, "a beats b"): S.REPRODUCED, (1, "c ~ a"): S.REPRODUCED, (1, "d beats a"): S.CONTRADICTED,
                   (1, "e beats a"): S.RULED_OUT, (1, "a beats c"): S.UNDERPOWERED}
    assert tests[4]["duplicate_of"] == "c ~ a" and not tests[4]["p_values"]  # one contrast, tested once
    assert report["claims"][0]["verdict"] == S.CONTRADICTED


def test_mixed_code_versions_are_refused_unless_allowed():
    from vitkit.errors import ConfigError
    from vitkit.reproduce import report as rep

    values = {n: {"test_top1": {"0": v, "1": v + d, "2": v - d}} for n, v, d in (("a", 0.8, 0.01), ("b", 0.7, 0.012))}
    t = {"text": "a beats b", "kind": "contrast", "metric": "test_top1", "expect": ">", "ref": 0.0, "margin": 0.01,
         "weights": [["a", 1.0], ["b", -1.0]]}
    code = {"a": {"0": "abc", "1": "abc", "2": "abc"}, "b": {"0": "abc", "1": "def+dirty", "2": "abc"}}
    report = {"values": values, "code": code, "alpha": 0.05, "claims": [{"id": 1, "tests": [dict(t)]}]}
    with pytest.raises(ConfigError, match="different code versions.*--allow-mixed-code"):
        rep.evaluate(report)
    report.update(allow_mixed_code=True)
    rep.evaluate(report)
    assert report["claims"][0]["tests"][0]["verdict"] == S.REPRODUCED


def test_budget_costs_estimated_from_the_committed_report():
    """The budgets' promises, from docs/reproduction/v1/report.json's measured training time: quick <= 45 min
    and full <= 12 h wall with --jobs 2 on 2 cores; full has >= 5 seeds and a sweep."""
    from pathlib import Path

    from vitkit.reproduce import get_budget
    from vitkit.reproduce.estimate import estimate

    ref = Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "v1" / "report.json"
    quick, full = estimate("quick", ref, version=2), estimate("full", ref, version=2)  # the v2 budgets' promises
    import json

    from vitkit.reproduce.estimate import budgets_json
    committed = json.loads((ref.parents[1] / "budgets.json").read_text())
    assert committed == json.loads(json.dumps(budgets_json(ref))), "regenerate: python -m vitkit.reproduce.estimate"
    assert quick["wall_hours"] <= 0.75 and full["wall_hours"] <= 12.0, (quick, full)
    # each estimate fitted to a quick run measured on a machine kind is derived from that run's report
    for kind in sorted(ref.parents[1].glob("quick-*")):
        name = f"docs/reproduction/{kind.name}/report.json"
        assert json.loads((kind / "estimate.json").read_text()) == json.loads(json.dumps(budgets_json(
            kind / "report.json", name=name))), f"regenerate: python -m vitkit.reproduce.estimate {name}"
    assert len(get_budget("full").seeds) >= 5 and len(get_budget("full").lr_sweep) >= 3
    assert len(get_budget("full").sweep_seeds) >= 2  # v3: the rates are chosen at two seeds
    # v3's pilot: under 30 minutes at --jobs 2 on the Intel kind's fit; it trains only the primaries' arms
    intel = ref.parents[1] / "quick-intel-amx" / "report.json"
    pilot = estimate("quick", intel)
    assert pilot["wall_hours"] <= 0.5 and pilot["runs"] < estimate("quick", intel, version=2)["runs"] * 1.5, pilot
    # every (arm, seed) of the campaign is counted once: the sweep's run at the chosen rate is reused
    from collections import Counter

    from vitkit.reproduce.estimate import run_list
    b = get_budget("full", version=2)
    per_run = Counter()
    for arm, k in run_list(b):
        per_run[arm.name] += k
    assert set(per_run.values()) == {len(b.seeds), len(b.sweep_seeds)}
    assert per_run["vit@lr1e-3"] == len(b.seeds) and per_run["vit@lr4e-3"] == len(b.sweep_seeds)


def test_budget_cost_fitted_to_a_complete_v2_report_on_its_machine(tmp_path):
    """A v2 report (one invocation of a whole budget) fits its machine's rate to each run's training time and
    charges the rest of its wall time as a per-run overhead: constructed from a known rate and overhead, the
    fit recovers both and the estimate of the same budget gives back its wall time; a partial or foreign
    report is refused."""
    import json

    from vitkit.errors import DataError
    from vitkit.reproduce import get_budget
    from vitkit.reproduce.estimate import arm_macs, budgets_json, estimate, fit, passes, run_list

    b = get_budget("quick", version=2)
    rate, overhead, jobs = 2.5e-10, 7.0, 2
    train_s, total, n = {}, 0.0, 0
    for arm, k in run_list(b):
        seen, ev = passes(arm, b)
        t = rate * 3 * arm_macs(arm) * seen
        seeds = train_s.setdefault(arm.name, {})  # the sweep's run at the chosen rate is one of the arm's seeds
        seeds.update({str(len(seeds) + i): t for i in range(k)})
        total += k * (t + rate * arm_macs(arm) * ev + overhead)
        n += k
    report = {"budget": "quick", "compute": {"complete": True, "train_s": train_s, "wall_s": total / jobs,
                                             "jobs": jobs, "runs": n, "machines": {"AMD EPYC x2 cores": n}}}
    r, o = fit(report)
    assert r == pytest.approx(rate, rel=1e-9) and o == pytest.approx(overhead, rel=1e-6)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    est = estimate("quick", path, jobs, version=2)
    assert est["wall_s"] == pytest.approx(total / jobs, rel=1e-9) and est["runs"] == n
    full = estimate("full", path, jobs, version=2)
    assert full["overhead_s_per_run"] == pytest.approx(overhead) and full["wall_s"] > 10 * est["wall_s"]
    doc = budgets_json(path, jobs, name="quick-x/report.json")
    assert doc["machine"] == "AMD EPYC x2 cores" and doc["measured"]["wall_s"] == pytest.approx(total / jobs, rel=1e-3)
    assert doc["budgets"]["quick"]["wall_s"] == pytest.approx(total / jobs, rel=1e-3)
    # half the wall time than the training alone needs: no negative overhead
    assert fit({**report, "compute": {**report["compute"], "wall_s": total / jobs / 10}})[1] == 0.0
    with pytest.raises(DataError, match="compute.complete is false"):
        fit({**report, "compute": {**report["compute"], "complete": False}})
    with pytest.raises(DataError, match="not a run of budget quick"):
        fit({**report, "compute": {**report["compute"], "train_s": {**train_s, "nonesuch@lr1e-3": {"0": 1.0}}}})


def test_two_names_of_one_run_are_not_two_arms_and_missing_seeds_are_said():
    from vitkit.reproduce import get_budget
    from vitkit.reproduce import report as rep
    from vitkit.reproduce.claims import Arm, Claim, Test, diff

    arms = {n: Arm(name=n, model={}) for n in ("a", "b", "c")}
    claim = Claim(id=99, title="t", paper="p", setup="s", arms=("a", "b", "c"),
                  tests=(Test(text="a beats b", weights=diff("a", "b")),
                         Test(text="a beats c", weights=diff("a", "c"))))
    ms = {"r": [{"seed": s, "test_top1": 0.8 + 0.01 * s, "params": 1, "macs": 1} for s in (0, 1, 2)],
          "rc": [{"seed": s, "test_top1": 0.7 + 0.012 * s, "params": 1, "macs": 1} for s in (0, 1)]}
    budget = get_budget("quick").with_(seeds=(0, 1, 2))
    from vitkit.errors import ConfigError
    with pytest.raises(ConfigError, match=r"missing seeds c: \[2\]: train them, or pass --allow-missing-seeds"):
        rep.build([claim], arms, {"a": "r", "b": "r", "c": "rc"}, ms, budget)
    out = rep.build([claim], arms, {"a": "r", "b": "r", "c": "rc"}, ms, budget, allow_missing_seeds=True)
    t_ab, t_ac = out["claims"][0]["tests"]
    assert "same run" in t_ab["error"] and t_ab["verdict"] == S.UNDERPOWERED
    assert t_ac["design"] == "welch" and t_ac["missing_seeds"] == {"c": [2]}
    assert out["missing_seeds"] == {"c": [2]}


def test_late_gain_says_whether_a_run_was_still_improving():
    from vitkit.reproduce.measure import late_gain

    rising = [[e, 0.5 + 0.03 * e] for e in range(1, 13)]
    flat = [[e, min(0.8, 0.5 + 0.1 * e)] for e in range(1, 13)]
    assert late_gain(rising) == pytest.approx(0.03 * 12 - 0.03 * 9)
    assert late_gain(flat) == pytest.approx(0.0) and late_gain(flat[:3]) is None


def test_a_run_resumed_by_other_code_reads_as_a_mix(tmp_path, monkeypatch):
    import json

    from vitkit.reproduce import measure
    folder = tmp_path / "run"
    monkeypatch.setattr(measure, "code_version", lambda: {"commit": "a" * 40, "dirty": False, "version": "0.1.0"})
    measure.record_provenance(folder)
    measure.record_provenance(folder)  # resumed by the same code: nothing to add
    prov = json.loads((folder / measure.PROVENANCE).read_text())
    assert "resumed_with" not in prov and measure.code_id(measure.run_code(prov)) == "a" * 12
    monkeypatch.setattr(measure, "code_version", lambda: {"commit": "b" * 40, "dirty": True, "version": "0.1.0"})
    measure.record_provenance(folder)
    prov = json.loads((folder / measure.PROVENANCE).read_text())
    assert measure.code_id(measure.run_code(prov)) == f"{'a' * 12} then {'b' * 12}+dirty"


def test_v1_reanalysed_under_the_v2_rule_is_committed():
    """docs/reproduction/v1/reanalysis.json is what the v2 rule makes of the v1 report's stored summaries."""
    import json
    from pathlib import Path

    from vitkit.reproduce.reanalyse import reanalyse

    folder = Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "v1"
    v1 = json.loads((folder / "report.json").read_text())
    got = json.loads(json.dumps(reanalyse(v1)))
    assert json.loads((folder / "reanalysis.json").read_text()) == got, \
        "regenerate: python -m vitkit.reproduce.reanalyse"
    # claim 2's two comparisons were one contrast: counted once
    c2 = [t for t in got["tests"] if t["claim"] == 2]
    assert c2[1]["duplicate"] and not c2[1]["p_values"]
    assert set(got["claims"].values()) <= set(S.VERDICTS)
