"""Claim markers: how README.md and docs/ quote a measured number next to the JSON it comes from.

A marker is an HTML comment right after the number: ``88.62%<!-- claim FILE KEY FORMAT -->`` (see
tests/test_docs_claims.py, which checks every marker against its JSON). After a benchmark rewrites its JSON,
``--refresh`` puts the JSON's current values in front of the markers that name it, so the numbers cannot be
retyped wrong; the prose around them still has to be read again (a sentence may no longer hold)::

    python benchmarks/claims.py --refresh docs/performance.md --only benchmarks/results/intel-amx/cpu_kernels.json
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*claim\s+(\S+)\s+(.+?)\s+(\S+)\s*-->")  # path, key (may hold spaces), format
NUMBER = re.compile(r"(?:(?<![\d>])[-+])?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")  # "1.04-1.40x": two numbers


def value(data: Any, key: str) -> Any:
    """The value at a dotted ``key`` (list items by index), or the ratio ``KEY_A / KEY_B``."""
    if " / " in key:
        a, b = key.split(" / ")
        return value(data, a) / value(data, b)
    for part in key.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def render(v: float, fmt: str) -> str:
    """``v`` as the docs write it in format ``fmt``."""
    if fmt in ("pct1", "pct2"):
        return f"{100 * v:.{fmt[-1]}f}"
    if re.fullmatch(r"f\d", fmt):
        return f"{v:.{fmt[1]}f}"
    if re.fullmatch(r"e\d", fmt):
        return f"{v:.{fmt[1]}e}"
    if fmt == "int":
        return str(int(round(v)))
    if fmt == "min1":
        return f"{v / 60:.1f}"
    if fmt == "ms0":
        return f"{v * 1000:.0f}"
    if fmt == "x2":
        return f"{v:.2f}"
    raise ValueError(f"unknown claim format {fmt!r}")


def refresh(doc: Path, only: Optional[List[str]] = None) -> int:
    """Rewrite the number before each marker of ``doc`` (naming one of ``only``, or any) from its JSON; the
    count of numbers changed."""
    cache: Dict[str, Any] = {}
    changed = 0
    lines = doc.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        out, pos = [], 0
        for m in MARKER.finditer(line):
            path, key, fmt = m.groups()
            if only and path not in only:
                continue
            before = line[pos:m.start()]
            # read as the docs test reads it: after a marker (">"), "-1.16" in "1.03<!-- -->-1.16" is a range's end
            lead = ">" if pos else ""
            numbers = list(NUMBER.finditer(lead + MARKER.sub(lambda x: "#" * (len(x.group()) - 1) + ">", before)))
            if not numbers:
                continue
            if path not in cache:
                cache[path] = json.loads((ROOT / path).read_text())
            new = render(value(cache[path], key), fmt)
            n = numbers[-1]
            a, b = n.start() - len(lead), n.end() - len(lead)
            if n.group().replace(",", "") != new:
                before = before[:a] + new + before[b:]
                changed += 1
            out.append(before + m.group())
            pos = m.end()
        lines[i] = "".join(out) + line[pos:]
    doc.write_text("".join(lines))
    return changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh", nargs="+", required=True, metavar="DOC", help="markdown files to rewrite")
    ap.add_argument("--only", nargs="*", metavar="JSON", help="only the markers naming these files (repo paths)")
    args = ap.parse_args()
    for doc in args.refresh:
        print(f"{doc}: {refresh(Path(doc), args.only)} numbers changed")


if __name__ == "__main__":
    main()
