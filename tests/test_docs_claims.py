"""Every measured number quoted in README.md and docs/ is an artefact: it is followed by a marker naming the
JSON a committed script wrote and the value's key there, and this test checks that they still agree.

A marker is an HTML comment right after the number (invisible in the rendered page)::

    reached **88.62%**<!-- claim docs/figures/training/fmnist-demo.json test_top1 pct2 -->

``KEY`` is a dotted path into the JSON (list items by index, e.g. ``runs.0.test_top1``; it may contain spaces);
``FORMAT`` says how
the value is written: ``pct1`` / ``pct2`` (a fraction as a percentage with 1 / 2 decimals), ``f0`` ...
``f4`` (fixed decimals), ``e1`` / ``e2`` (scientific), ``int`` (an integer, thousands separated by commas
or not), ``min1`` (seconds as minutes, 1 decimal), ``ms0`` (seconds as whole milliseconds), ``x2`` (a ratio
with 2 decimals, written 1.23x).
``KEY`` may also be ``KEY_A / KEY_B``: the ratio of two values of the same JSON (a speed-up, "1.31x").

A number that looks measured (a figure with a unit - %, ms, s, min, hours, MiB, GB, img/s - or a ratio such as
1.40x) and carries no claim marker fails the test, unless its line says why it is not a measurement of this
project with ``<!-- not measured: REASON -->`` (a setting, a target, a figure quoted from the paper or
another project). Code blocks and inline code are examples and are not read; docs/reproduction/report.md is
rendered from its JSON and checked whole by its own test.
"""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from claims import MARKER, NUMBER, render, value  # noqa: E402 - the one definition of the marker grammar


def _docs():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def _claims():
    for doc in _docs():
        for lineno, line in enumerate(doc.read_text().splitlines(), 1):
            for m in MARKER.finditer(line):
                before = MARKER.sub("", line[:m.start()])
                numbers = NUMBER.findall(before)
                yield doc.relative_to(ROOT), lineno, numbers[-1] if numbers else None, m.groups()


CLAIMS = list(_claims())


def test_the_docs_quote_measured_numbers():
    assert len(CLAIMS) >= 20, "the docs should quote their measured numbers with claim markers"


@pytest.mark.parametrize("doc,lineno,number,marker", CLAIMS,
                         ids=[f"{c[0]}:{c[1]}" for c in CLAIMS])
def test_quoted_number_matches_its_artefact(doc, lineno, number, marker):
    path, key, fmt = marker
    artefact = ROOT / path
    assert artefact.is_file(), f"{doc}:{lineno}: {path} does not exist"
    got = value(json.loads(artefact.read_text()), key)
    assert number is not None, f"{doc}:{lineno}: no number before the marker for {path} {key}"
    assert number.replace(",", "") == render(got, fmt), \
        f"{doc}:{lineno}: the docs say {number}, {path} {key} is {got} ({render(got, fmt)})"


UNIT = (r"%|[x×](?!\s?\d)|ms|s|sec|seconds?|min|minutes?|h|hours?|[KMG]i?B|images/s|img/s|steps/s")
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:" + UNIT + r")(?![\w/])")
NOT_MEASURED = re.compile(r"<!--\s*not measured:\s*\S.*?-->")
RENDERED = {"docs/reproduction/report.md", "docs/reproduction/v1/report.md"} | {  # written by `vitkit reproduce`
    p.relative_to(ROOT).as_posix() for pattern in ("quick-*/report.md", "pilot-*/report.md")  # (own tests)
    for p in (ROOT / "docs" / "reproduction").glob(pattern)}


def unmarked_numbers(text: str):
    """(line, number with unit) of every measured-looking number in ``text`` that carries no claim marker."""
    fence, indented, blank = False, False, True
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        indented = line.startswith(("    ", "\t")) and (blank or indented)  # an indented code block
        blank = not line.strip()
        if fence or indented or NOT_MEASURED.search(line):
            continue
        line = re.sub(r"`[^`]*`", "", line)
        pos = 0
        for m in list(MARKER.finditer(line)) + [None]:
            segment = line[pos:m.start() if m else len(line)]
            found = list(MEASURED.finditer(segment))
            if m is not None and found and not NUMBER.search(segment[found[-1].end():]):
                found = found[:-1]  # the last number before a marker is the claim's
            for hit in found:
                yield lineno, hit.group(0)
            pos = m.end() if m else len(line)


def test_every_measured_number_carries_a_marker():
    bad = [f"{doc.relative_to(ROOT)}:{lineno}: {number}" for doc in _docs()
           if doc.relative_to(ROOT).as_posix() not in RENDERED
           for lineno, number in unmarked_numbers(doc.read_text())]
    assert not bad, ("numbers that look measured but name no artefact: add <!-- claim FILE KEY FMT --> after "
                     "each, or <!-- not measured: REASON --> to the line:\n" + "\n".join(bad))


def test_the_unmarked_number_check_can_fail():
    text = ("vitkit runs 1.40x faster, 35 ms a batch<!-- claim a.json t f0 -->, 650 MiB\n"
            "a 4 x 4 grid, ViT-B/16 and 12 blocks\n"
            "the target: >= 91 % in 15 minutes <!-- not measured: the recipe's target -->\n"
            "```\n88.00 % in a code block\n```\n\n    machine: 23.5 GiB, an indented code block\n"
            "`--epochs 3` and 2.5x<!-- claim a.json r x2 -->\n")
    assert list(unmarked_numbers(text)) == [(1, "1.40x"), (1, "650 MiB")]


def test_markers_are_read_as_intended():
    line = ("took **8 min 33 s**, 1,234 steps<!-- claim a.json steps int --> and 88.40%<!-- claim a.json "
            "runs.seed 0.t pct2 -->")
    found = [(NUMBER.findall(MARKER.sub("", line[:m.start()]))[-1], m.groups()) for m in MARKER.finditer(line)]
    assert found == [("1,234", ("a.json", "steps", "int")), ("88.40", ("a.json", "runs.seed 0.t", "pct2"))]
    assert render(0.884, "pct2") == "88.40" and render(512.0, "min1") == "8.5" and render(1234, "int") == "1234"
    assert value({"runs": [{"a": 1}]}, "runs.0.a") == 1
    assert value({"a": 3.0, "b": {"c": 2.0}}, "a / b.c") == 1.5


def test_refresh_rewrites_the_numbers_from_their_json(tmp_path, monkeypatch):
    import claims

    monkeypatch.setattr(claims, "ROOT", tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"r": 0.9123, "n": 1500, "t": {"x": 2.0, "y": 4.0}}))
    (tmp_path / "b.json").write_text(json.dumps({"r": 0.5}))
    doc = tmp_path / "d.md"
    doc.write_text("top-1 88.00%<!-- claim a.json r pct2 --> in 1,234<!-- claim a.json n int --> steps, "
                   "0.40<!-- claim a.json t.x / t.y x2 -->x; kept 1.00<!-- claim b.json r f2 -->\nno marker 3.0x\n"
                   "a range 0.10<!-- claim a.json r f2 -->-0.20<!-- claim a.json t.x f2 -->x\n")
    assert claims.refresh(doc, ["a.json"]) == 5
    assert doc.read_text() == ("top-1 91.23%<!-- claim a.json r pct2 --> in 1500<!-- claim a.json n int --> steps, "
                               "0.50<!-- claim a.json t.x / t.y x2 -->x; kept 1.00<!-- claim b.json r f2 -->\n"
                               "no marker 3.0x\n"
                               "a range 0.91<!-- claim a.json r f2 -->-2.00<!-- claim a.json t.x f2 -->x\n")
    assert claims.refresh(doc) == 1 and "kept 0.50<!--" in doc.read_text()


def test_hybrid_cost_table_is_what_the_cost_model_computes():
    """docs/hybrid_mpp.md's table of hybrids (parameters, GMACs, the ResNet's share) is `vitkit info` output."""
    from vitkit.config import config_from_name
    from vitkit.models.cost import cost

    rows = re.findall(r"^\| `(R[^`]+)` \|.*\| ([\d,]+) \| ([\d.]+) \(([\d.]+)\) \|$",
                      (ROOT / "docs" / "hybrid_mpp.md").read_text(), flags=re.M)
    assert len(rows) >= 5
    for name, params, gmacs, resnet in rows:
        c = cost(config_from_name(name))
        assert (params, gmacs, resnet) == (f"{c.params:,}", f"{c.macs / 1e9:.2f}",
                                           f"{c.macs_breakdown['backbone'] / 1e9:.2f}"), name


def test_committed_reproduction_reports():
    """A v2 docs/reproduction/report.md is what `vitkit reproduce` renders from the report.json beside it,
    every verdict re-derived from its per-seed values, on every run of the full budget; the v1 report is
    kept, frozen, under v1/ and is what the budget estimates are fitted to."""
    from vitkit.reproduce import get_budget

    folder = ROOT / "docs" / "reproduction"
    v1 = json.loads((folder / "v1" / "report.json").read_text())
    assert "version" not in v1 and v1["budget"] == "full" and len(v1["claims"]) == 10
    md = (folder / "v1" / "report.md").read_text()
    for c in v1["claims"]:  # the frozen markdown still shows the JSON's verdicts
        assert f"| {c['id']}. {c['title']} | {c['verdict']} |" in md
        if c.get("figure_file"):
            assert (folder / "v1" / c["figure_file"]).is_file()
    import sys

    from vitkit.reproduce.markdown import markdown
    sys.path.insert(0, str(ROOT / "tests"))
    from test_reproduce_stats import rederive

    # the quick budget timed end to end on a machine kind (quick-<kind>/): one invocation, one code version
    kinds = sorted(folder.glob("quick-*/report.json"))
    assert {k.parent.name for k in kinds} >= {"quick-amd-avx2", "quick-intel-amx"}
    for path in kinds:
        quick = json.loads(path.read_text())
        figs = {rec["id"]: rec["figure_file"] for rec in quick["claims"] if rec.get("figure_file")}
        assert (path.parent / "report.md").read_text() == markdown(quick, figs)
        assert rederive(quick) == {(c["id"], t["text"]): t["verdict"] for c in quick["claims"] for t in c["tests"]}
        assert quick["budget"] == "quick" and quick["compute"]["complete"]
        assert len(quick["compute"]["code_versions"]) == 1 and len(quick["compute"]["machines"]) == 1
        assert all((path.parent / name).is_file() for name in figs.values())
    if not (folder / "report.json").is_file():
        assert not (folder / "report.md").exists()
        return

    report = json.loads((folder / "report.json").read_text())
    figures = {rec["id"]: rec["figure_file"] for rec in report["claims"] if rec.get("figure_file")}
    assert (folder / "report.md").read_text() == markdown(report, figures)
    assert rederive(report) == {(c["id"], t["text"]): t["verdict"] for c in report["claims"] for t in c["tests"]}
    full = get_budget("full")
    assert report["version"] == 2 and report["budget"] == "full" and report["seeds"] == list(full.seeds)
    assert not report["missing_seeds"] and len(report["compute"]["code_versions"]) == 1
    for name in figures.values():
        assert (folder / name).is_file(), name


def test_committed_v3_pilot_and_the_design_it_sizes(tmp_path):
    """A v3 pilot (docs/reproduction/pilot-<kind>/): one invocation of the quick budget at one code version on
    one machine, its report.md rendered from its report.json, the primaries' p-values and their Holm
    adjustment re-derived from the per-seed values;
    and design.json, the full budget's design made from that pilot before the campaign's first run, is what
    the planner makes from the committed report.json (spreads pooled with the plan's prior, the machine rate
    fitted to the pilot's runs)."""
    from vitkit.reproduce import campaign, get_budget, rule
    from vitkit.reproduce.catalog import plan as catalog_plan
    from vitkit.reproduce.markdown import markdown
    sys.path.insert(0, str(ROOT / "tests"))
    from test_reproduce_e2e import _rederive_primaries

    pilots = sorted((ROOT / "docs" / "reproduction").glob("pilot-*/report.json"))
    assert {p.parent.name for p in pilots} >= {"pilot-amd-avx2"}
    prereg = rule.load_plan()
    for path in pilots:
        rep = json.loads(path.read_text())
        figs = {rec["id"]: rec["figure_file"] for rec in rep["claims"] if rec.get("figure_file")}
        assert (path.parent / "report.md").read_text() == markdown(rep, figs)
        prim, ps, holm = _rederive_primaries(rep)  # the primaries' p-values and Holm, from the per-seed values
        assert prim and rep["tests_in_family"] == len(prim)
        for t, p, q in zip(prim, ps, holm):
            assert t["p_one_sided"] == pytest.approx(p, rel=1e-6) and t["p_adjusted"]["primary"] == pytest.approx(q)
        assert rep["version"] == 3 and rep["budget"] == "quick" and rep["compute"]["complete"]
        assert rep["plan"]["sha256"] == prereg["sha256"]  # the plan the campaign follows, unchanged since
        assert len(rep["compute"]["code_versions"]) == 1 and len(rep["compute"]["machines"]) == 1
        assert all((path.parent / name).is_file() for name in figs.values())
        budget = get_budget("full").with_(plan_sha=prereg["sha256"])
        claims, arms, names = catalog_plan(None, budget)
        campaign.before_training(prereg, claims, arms, names, budget, tmp_path / path.parent.name, path, 2,
                                 lambda line: None, restore=lambda: None)
        made = json.loads((tmp_path / path.parent.name / "runs" / "design.json").read_text())
        committed = json.loads((path.parent / "design.json").read_text())
        assert {k: v for k, v in made.items() if k != "pilot"} == {k: v for k, v in committed.items() if k != "pilot"}
        # every claim it leaves out is short of its effect at the level it was judged at, every one it keeps
        # reaches the plan's power; the full budget tests at least 6 of the 10 claims
        for c, rec in committed["claims"].items():
            assert rec["mde"] > rec["effect"] or rec["testable"] or "budget" in rec["reason"], c
            assert not rec["testable"] or rec["power"] >= prereg["power"], c
        assert len(committed["testable"]) >= 6
