"""vitkit reproduce v3: the seeds planned again once the sweep has fixed every arm's rate and schedule, before
any seed beyond the sweep's trains (synthetic spreads, no training)."""
import json

import pytest

from vitkit.reproduce import campaign, replan, report, rule, stats, sweep, verdict
from vitkit.reproduce.budget import get_budget
from vitkit.reproduce.catalog import plan as catalog_plan

SDS = {1: 0.02, 6: 0.015, 8: 0.012}  # planning SDs of the primaries (synthetic)
RATE, OVERHEAD = 1e-10, 5.0  # seconds per MAC and per run (synthetic)


def _setup(hours=16.0):
    prereg = rule.load_plan()
    b = get_budget("full").with_(hours=hours, plan_sha=prereg["sha256"])
    claims, arms, names = catalog_plan(list(SDS), b)
    sds = {c: {"sd": s, "df": 6, "sd_plan": s} for c, s in SDS.items()}
    design = campaign.make_design(prereg, claims, arms, b, sds, RATE, OVERHEAD, 2)
    return prereg, b, claims, arms, names, design


def _swept(arms, names, b, k=1.0, grow=0):
    """What a sweep trained: every family's starting grid (``grow`` more rates each) at schedule ``k``; its
    choice the first rate."""
    fams = sweep.families(names, arms, fixed=True)
    grids = {f: sweep.rates(arms[f], b) for f in fams}
    for f in fams:
        if arms[f].lr is None:
            grids[f] = grids[f] + [grids[f][-1] * 2 ** (i + 1) for i in range(grow)]
    chosen = {f: {"lr": grids[f][0], "stretch": k, **({"fixed": True} if arms[f].lr is not None else {})}
              for f in fams}
    resolved = sweep.resolve(arms, chosen)
    return resolved, sweep.sweep_arms(fams, arms, b, grids, {f: k for f in fams}, resolved)


def test_the_same_schedules_give_the_design_back():
    """A sweep that chose the budget's schedules on the starting grids costs what the design priced: the
    re-plan is the design."""
    prereg, b, claims, arms, names, design = _setup()
    (runs, alias), swept = _swept(arms, names, b)
    got = replan.replan(prereg, design, claims, arms, runs, alias, swept, b)
    assert got["budget_s"] == pytest.approx(design["budget_s"], rel=1e-9)
    for c, r in got["claims"].items():
        for k in ("testable", "seeds", "power", "mde"):
            assert r["after"][k] == pytest.approx(r["before"][k]), (c, k)
    assert got["cost_s"] == pytest.approx(design["cost_s"], rel=1e-9)


def test_longer_schedules_buy_fewer_seeds_within_the_budget():
    prereg, b, claims, arms, names, design = _setup()
    (runs, alias), swept = _swept(arms, names, b, k=2.0, grow=1)  # every schedule doubled, every grid grown
    got = replan.replan(prereg, design, claims, arms, runs, alias, swept, b)
    before = {c: r["before"] for c, r in got["claims"].items()}
    after = {c: r["after"] for c, r in got["claims"].items()}
    assert all(before[c]["testable"] for c in before)  # the design could test all three
    assert got["cost_s"] <= got["budget_s"] and got["sweep_s"] > 2 * design["sweep_s"]
    fewer = [c for c in after if not after[c]["testable"] or after[c]["seeds"] < before[c]["seeds"]]
    assert fewer, got["claims"]
    for c in after:
        if after[c]["testable"]:
            assert after[c]["power"] >= 0.8 and after[c]["seeds"] <= before[c]["seeds"]
        else:
            assert after[c]["reason"].startswith("after the sweep: ")
    # the planner's own accounting: each testable claim's power at its seeds and the level over the testable ones
    on = [c for c in after if after[c]["testable"]]
    assert got["level"] == pytest.approx(prereg["alpha"] / len(on))
    for c in on:
        assert after[c]["power"] == pytest.approx(stats.power(
            design["claims"][c]["effect"], SDS[int(c)], after[c]["seeds"], got["level"], design["claims"][c]["expect"]))
    lines = replan.replan_lines(got)
    assert len(lines) == 3 and all("->" in x for x in lines)


def test_the_replan_is_made_once_kept_in_the_state_and_read_by_the_report(tmp_path):
    prereg, b, claims, arms, names, design = _setup()
    (runs, alias), swept = _swept(arms, names, b, k=4.0)
    log = []
    kept, got, seeds = replan.after_sweep(prereg, design, claims, arms, names, (runs, alias), swept, b, tmp_path,
                                          log.append)
    saved = json.loads((tmp_path / "runs" / "replan.json").read_text())
    assert saved == json.loads(json.dumps(got["replan"])) and any("planned again" in x for x in log)
    off = [int(c) for c, r in got["claims"].items() if not r["testable"]]
    assert off, got["claims"]  # four times the schedules: a claim no longer fits
    assert got["claims"][str(off[0])]["before_sweep"]["testable"] is True
    only_off = {a for c in claims if c.id in off for a in rule.claim_arms(c, arms)} - \
        {a for c in claims if c.id not in off for a in rule.claim_arms(c, arms)}
    assert only_off and not only_off & set(kept)  # its seeded arms are not trained
    assert all(len(seeds[n]) == max(len(b.seeds), saved["arms"].get(alias[n], 0)) for n in kept)
    # resumed: read back, not made again (even from another sweep)
    (r2, a2), s2 = _swept(arms, names, b)
    again = replan.after_sweep(prereg, design, claims, arms, names, (r2, a2), s2, b, tmp_path, log.append)[1]
    assert again["replan"] == got["replan"]
    # the state archive carries it
    from vitkit.reproduce.state import load_state, save_state
    save_state(tmp_path, tmp_path / "state.tar.gz", set())
    dest = tmp_path / "elsewhere"
    load_state(tmp_path / "state.tar.gz", dest)
    assert json.loads((dest / "runs" / "replan.json").read_text()) == saved
    # the report: the claim dropped after the sweep is not testable, with the re-plan's reason
    ms = {n: [{"seed": s, "test_top1": 0.8 + 0.003 * ((s * 7) % 5), "fewshot_5": 0.8, "val_top1": 0.8,
               "code": None, "plan": prereg["sha256"], "params": 1, "macs": 1, "curve": [[e, 0.8] for e in range(12)]}
              for s in range(5)] for n in kept}
    sweeps = {arms[n].family: {"lr": 2e-3, "edge": None, "val_top1": {}} for n in names if arms[n].lr is None}
    rep = report.build(claims, arms, {n: n for n in arms}, ms, b.with_(seeds=tuple(range(5))), plan=prereg,
                       sweeps=sweeps, design=got)
    c = next(c for c in rep["claims"] if c["id"] == off[0])
    assert c["verdict"] == verdict.NOT_TESTABLE and c["tests"][0]["note"].startswith("after the sweep: ")
    from vitkit.reproduce import markdown
    lines = markdown.replan_table(rep)
    assert lines[1].startswith("**Seeds planned again after the sweep**")
    row = next(x for x in lines if x.startswith(f"| {off[0]} |"))
    before = got["claims"][str(off[0])]["before_sweep"]
    assert row.startswith(f"| {off[0]} | {before['seeds']} | {before['power']:.0%} / ") and "not testable" in row
    assert "**Seeds planned again after the sweep**" in markdown.markdown(rep, {})
