"""What each claim's verdict means at this scale, in one sentence a claim, generated from report.json: the
wording that README and docs/reproduction/README.md quote, so the prose can never say more than the report.

:func:`claim_sentences` words a report (v3: the claim's pre-registered primary and its verdict; v2: the
claim's combined verdict and the comparisons that made it); :func:`docs_block` is the block the docs quote,
between ``<!-- wording: FILE -->`` and ``<!-- wording end -->`` (FILE: the report.json it was generated from);
:func:`meanings_block` says, per verdict, what a v3 sentence will say. ``python -m vitkit.reproduce.wording
REPORT.json`` prints the block for a report; ``--refresh DOC.md`` writes a document's blocks again.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import stats
from .verdict import INCONCLUSIVE, NO_VERDICT, NOT_TESTABLE

BEGIN, END = "<!-- wording: {} -->", "<!-- wording end -->"
BLOCK = re.compile(r"<!-- wording: (\S+) -->\n(?:(?!<!-- wording)[\s\S])*<!-- wording end -->")  # never two blocks

# v3: what a primary's verdict means ({test}: the pre-registered primary hypothesis)
MEANINGS: Dict[str, str] = {
    stats.REPRODUCED: "the pre-registered primary hypothesis '{test}' holds under Holm's correction over the "
                      "primaries, from arms that converged at interior rates",
    stats.RULED_OUT: "the interval for '{test}' excludes the effect of interest, so here the paper's effect is "
                     "absent or smaller than the plan asked for",
    stats.CONTRADICTED: "the interval for '{test}' lies wholly on the other side, so here the opposite holds",
    INCONCLUSIVE: "the interval for '{test}' neither confirms it nor excludes the effect of interest, so these "
                  "runs cannot tell",
    NOT_TESTABLE: "'{test}' was not trained: before its seeded runs, the design (or its re-plan once the sweep had "
                  "chosen) found that its seeds could not reach the planned power within the budget, so nothing is "
                  "claimed either way",
    NO_VERDICT: "'{test}' carries no verdict because an arm failed the convergence, interior-rate or parent check, "
                "so its estimate is not evidence either way",
    stats.UNDERPOWERED: "'{test}' could not be tested (no spread to test it with), so nothing is claimed either way",
}
# v2: a claim's combined verdict ({tests}: the comparisons that decided it)
MEANINGS_V2: Dict[str, str] = {
    stats.REPRODUCED: "its comparisons held in the paper's direction after Holm's correction over every p-value "
                      "({tests})",
    stats.RULED_OUT: "the runs exclude an effect as large as the margin for {tests}, so here the paper's effect is "
                     "absent or smaller",
    stats.CONTRADICTED: "{tests} went significantly the other way",
    stats.UNDERPOWERED: "the runs cannot tell: no comparison decided the claim",
}


def scale(report: Mapping[str, Any]) -> str:
    """The scale the report's verdicts are about, from the report: the data set, its image size and the range of
    the trained models' parameter counts."""
    data = str(report.get("data") or "")
    name = data.split(" (", 1)[0] or "the data set"
    px = re.search(r"(\d+) px", data)
    params = [a["params"] for c in report.get("claims", []) for a in c.get("arms", []) if a.get("params")]
    size = f" with models of {min(params) / 1e6:.1g}-{max(params) / 1e6:.1g}M parameters" if params else ""
    return f"{name}{f' at {px.group(1)} px' if px else ''}{size}"


def _quoted(texts: Sequence[str]) -> str:
    q = [f"'{t}'" for t in texts]
    return q[0] if len(q) == 1 else ", ".join(q[:-1]) + " and " + q[-1]


def _meaning(c: Mapping[str, Any]) -> str:
    prim = next((t for t in c["tests"] if t.get("role") == "primary"), None)
    if prim is not None:
        return MEANINGS.get(prim["verdict"], MEANINGS[stats.UNDERPOWERED]).format(test=prim["text"])
    tests = [t for t in c["tests"] if not t.get("duplicate_of")]
    deciding = [t["text"] for t in tests if t["verdict"] == c["verdict"]]
    text = MEANINGS_V2.get(c["verdict"], MEANINGS_V2[stats.UNDERPOWERED]).format(tests=_quoted(deciding or ["-"]))
    held = [t["text"] for t in tests if t["verdict"] == stats.REPRODUCED]
    if c["verdict"] != stats.REPRODUCED and held:
        text += f" (single comparisons reproduced: {_quoted(held)})"
    return text


def claim_sentences(report: Mapping[str, Any]) -> Dict[int, str]:
    """Per claim, one sentence: its verdict and what that verdict means at the report's scale."""
    where = scale(report)
    return {int(c["id"]): f"**Claim {c['id']}, {c['title'].split(' (', 1)[0].lower()}: {c['verdict']}.** On "
                          f"{where}, {_meaning(c)}." for c in report["claims"]}


def docs_block(report: Mapping[str, Any], source: str) -> str:
    """The block the docs quote: the report's campaign, then one line per claim (:func:`claim_sentences`)."""
    v3 = bool(report.get("plan"))
    head = (f"From [{Path(source).name}]({Path(source).name}) ({'v3, the pre-registered rule' if v3 else 'v2'}, "
            f"budget {report.get('budget')}):")
    lines = [BEGIN.format(source), head, ""] + [f"- {s}" for s in claim_sentences(report).values()] + [END]
    return "\n".join(lines)


def meanings_block() -> str:
    """What a v3 sentence says for each verdict ({test}: the claim's primary hypothesis)."""
    return "\n".join([BEGIN.format("meanings"), "| verdict | what the sentence says |", "|---|---|"] +
                     [f"| {v} | {m.format(test='PRIMARY')} |" for v, m in MEANINGS.items()] + [END])


def blocks(text: str) -> List[Tuple[str, str]]:
    """(source, whole block) of every generated block in a document."""
    return [(m.group(1), m.group(0)) for m in BLOCK.finditer(text)]


def refreshed(text: str, root: Path) -> str:
    """``text`` with every generated block written again: a report's from the report.json it cites (a path
    relative to ``root``, the checkout), the meanings from :data:`MEANINGS`."""
    from ..errors import NotFoundError

    for source, whole in blocks(text):
        if source == "meanings":
            new = meanings_block()
        else:
            path = root / source
            if not path.is_file():
                raise NotFoundError(f"the wording cites {source}, which does not exist under {root}")
            new = docs_block(json.loads(path.read_text()), source)
        text = text.replace(whole, new)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``REPORT.json``: print its block; ``--refresh DOC.md``: write DOC's blocks again (run from the checkout)."""
    from ..errors import NotFoundError
    from ..utils import atomic_path

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2) or (len(args) == 2) != (args[0] == "--refresh"):
        print("usage: python -m vitkit.reproduce.wording REPORT.json | --refresh DOC.md", file=sys.stderr)
        return 2
    path = Path(args[-1])
    if not path.is_file():
        raise NotFoundError(f"{path}: no such file")
    if len(args) == 1:
        print(docs_block(json.loads(path.read_text()), args[0]))
        return 0
    with atomic_path(path) as tmp:
        tmp.write_text(refreshed(path.read_text(), Path.cwd()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
