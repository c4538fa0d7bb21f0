"""The honest wording: one sentence a claim saying what its verdict means at this scale, generated from
report.json; the docs quote exactly what the function writes from the report they cite."""
import copy
import json
from pathlib import Path

import pytest

from vitkit.errors import NotFoundError
from vitkit.reproduce import report, rule, stats, verdict, wording
from vitkit.reproduce.budget import get_budget
from vitkit.reproduce.catalog import plan as catalog_plan

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproduction" / "README.md"


def test_the_committed_wording_is_what_the_function_writes_from_the_report_it_cites():
    text = DOC.read_text()
    found = wording.blocks(text)
    sources = [s for s, _ in found]
    assert "meanings" in sources and any(s.endswith("report.json") for s in sources), sources
    assert wording.refreshed(text, ROOT) == text, "run python -m vitkit.reproduce.wording --refresh " + str(DOC)
    for source, whole in found:
        if source != "meanings":
            rep = json.loads((ROOT / source).read_text())
            assert whole.count("\n- **Claim ") == len(rep["claims"])  # one sentence a claim


def test_each_sentence_names_the_scale_and_follows_the_verdict():
    rep = json.loads((ROOT / "docs" / "reproduction" / "report.json").read_text())
    said = wording.claim_sentences(rep)
    assert sorted(said) == [c["id"] for c in rep["claims"]]
    params = [a["params"] for c in rep["claims"] for a in c["arms"] if a.get("params")]
    where = f"Fashion-MNIST at 28 px with models of {min(params) / 1e6:.1g}-{max(params) / 1e6:.1g}M parameters"
    for c in rep["claims"]:
        s = said[c["id"]]
        assert where in s and f": {c['verdict']}.**" in s and s.count(". ") <= 1, s
    # the words follow the verdict, not the claim: turn claim 3 around and its sentence turns too
    other = copy.deepcopy(rep)
    c3 = next(c for c in other["claims"] if c["id"] == 3)
    c3["verdict"] = stats.CONTRADICTED
    for t in c3["tests"]:
        t["verdict"] = stats.CONTRADICTED if t["text"].startswith("ViT gains") else t["verdict"]
    s = wording.claim_sentences(other)[3]
    assert "went significantly the other way" in s and "'ViT gains more than the ResNet" in s
    assert wording.scale({"data": "Fashion-MNIST (28 px)", "claims": [{"arms": [{"params": 150_000},
                                                                               {"params": 1_900_000}]}]}) == \
        "Fashion-MNIST at 28 px with models of 0.1-2M parameters"


def _v3_report(rising=(), design=None):
    """A v3 report of synthetic runs: claim 1 clearly reproduced, claim 6 with no effect."""
    prereg = rule.load_plan()
    b = get_budget("full").with_(seeds=tuple(range(6)))
    claims, arms, names = catalog_plan([1, 6, 8], b)
    noise = {s: 0.004 * ((s * 5) % 3 - 1) for s in b.seeds}
    val = {"vit": lambda s: 0.85 + noise[s], "pe-none": lambda s: 0.80 + 0.5 * noise[s],
           "vit-p7": lambda s: 0.85 + 0.3 * noise[s]}
    ms = {}
    for n in names:
        f = val.get(n, lambda s: 0.8 + 0.003 * ((s * 7) % 5))
        ms[n] = [{"seed": s, "test_top1": f(s), "fewshot_5": f(s), "val_top1": f(s), "code": None,
                  "plan": prereg["sha256"], "params": 100_000, "macs": 1,
                  "curve": [[e, f(s) - (0.005 * max(0, 12 - e) if n in rising else 0.0)] for e in range(1, 13)]}
                 for s in b.seeds]
    sweeps = {arms[n].family: {"lr": 2e-3, "edge": None, "val_top1": {}} for n in names if arms[n].lr is None}
    return report.build(claims, arms, {n: n for n in arms}, ms, b, plan=prereg, sweeps=sweeps, design=design)


def test_v3_sentences_word_the_primary_by_its_verdict():
    design = {"claims": {"8": {"testable": False, "reason": "needs more than 20 seeds", "mde": 0.05, "power": 0.3,
                               "seeds": 20}}}
    rep = _v3_report(design=design)
    by = {c["id"]: c for c in rep["claims"]}
    assert by[1]["verdict"] == stats.REPRODUCED and by[8]["verdict"] == verdict.NOT_TESTABLE
    said = wording.claim_sentences(rep)
    assert "'1D beats none (5-shot)' holds under Holm's correction" in said[1]
    assert "'MPP then 1k labels beats 1k labels from scratch' was not trained" in said[8]
    assert wording.MEANINGS[by[6]["verdict"]].format(test="patch 4 beats patch 7") in said[6]
    assert all("Fashion-MNIST at 28 px with models of 0.1-0.1M parameters" in s for s in said.values())
    gated = wording.claim_sentences(_v3_report(rising=("pe-none",)))
    assert "carries no verdict because an arm failed" in gated[1]
    block = wording.docs_block(rep, "runs/v3/report.json")
    assert block.startswith("<!-- wording: runs/v3/report.json -->\nFrom [report.json](report.json) (v3")
    assert wording.blocks(block) == [("runs/v3/report.json", block)]


def test_the_command_prints_and_refreshes(tmp_path, capsys):
    rep = _v3_report()
    (tmp_path / "report.json").write_text(json.dumps(rep))
    assert wording.main([str(tmp_path / "report.json")]) == 0
    assert capsys.readouterr().out.strip() == wording.docs_block(rep, str(tmp_path / "report.json"))
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n\n<!-- wording: meanings -->\nstale\n<!-- wording end -->\n\nafter\n")
    assert wording.main(["--refresh", str(doc)]) == 0
    assert doc.read_text() == "intro\n\n" + wording.meanings_block() + "\n\nafter\n"
    assert wording.main(["--refresh"]) == 2
    with pytest.raises(NotFoundError, match="no such file"):
        wording.main([str(tmp_path / "missing.json")])
    with pytest.raises(NotFoundError, match="does not exist"):
        wording.refreshed("<!-- wording: nope/report.json -->\n<!-- wording end -->", tmp_path)
