"""Two code versions on one machine, alternated: does a change make vitkit slower than it was?

A comparison with the committed record mixes the code with the host (two machines of one kind can differ by
half in speed); this runs ``inference.py`` (B/16, batch 16) and ``training.py`` from two git worktrees, one
after the other, ``--rounds`` times in the order A B A B ..., with the same Python, and writes each run's
bench.json and a summary: per version and row, the mean images/s over the rounds, and the ratio B / A with
the rounds' range. The peers measured beside vitkit in each run (timm, torchvision) say how much the machine
itself drifted between runs.

    python benchmarks/versions_ab.py --a /work/old --b . --rounds 2 --out benchmarks/results/KIND/versions-ab

Each worktree must hold a checkout with benchmarks/ and src/ (``git worktree add --detach DIR COMMIT``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

RUNS = {
    "inference": ["inference.py", "--dtype", "fp32", "bf16", "--batch", "16", "--repeats", "5",
                  "--peers", "torchvision", "timm"],
    "training": ["training.py", "--models", "S/16", "--dtype", "fp32", "bf16", "--repeats", "5", "--peers", "timm"],
    "training-demo": ["training.py", "--models", "recipe:fmnist-demo", "--dtype", "fp32", "bf16", "--repeats", "5",
                      "--peers", "timm"],
}


def git_head(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()


def run_one(tree: Path, what: str, out: Path, python: str) -> Dict[str, object]:
    cmd = [python, *RUNS[what], "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree / "benchmarks", env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"versions_ab: {what} in {tree} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"bench": json.loads((out / "bench.json").read_text()), "wall_s": round(time.perf_counter() - t0, 1)}


def key(row: Dict[str, object]) -> str:
    return f"{row['kind']} {row['model']} {row['dtype']} b{row['batch']} {row['library']}"


def summarize(runs: Dict[str, List[Dict[str, object]]]) -> Dict[str, object]:
    rates: Dict[str, Dict[str, List[float]]] = {}
    for version, items in runs.items():
        for item in items:
            for row in item["bench"]["rows"]:
                rates.setdefault(key(row), {}).setdefault(version, []).append(float(row["images_per_s"]))
    rows = {}
    for k, per in sorted(rates.items()):
        if set(per) != {"a", "b"} or len(per["a"]) != len(per["b"]):
            continue
        ratios = [b / a for a, b in zip(per["a"], per["b"])]
        rows[k] = {"a_img_s": round(statistics.mean(per["a"]), 3), "b_img_s": round(statistics.mean(per["b"]), 3),
                   "b_over_a": round(statistics.mean(per["b"]) / statistics.mean(per["a"]), 3),
                   "round_ratios": [round(r, 3) for r in ratios]}
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, type=Path, help="worktree of the version before")
    ap.add_argument("--b", required=True, type=Path, help="worktree of the version after")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--what", nargs="+", choices=sorted(RUNS), default=sorted(RUNS))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--summarize-only", action="store_true",
                    help="run nothing: summarize the OUT/{a,b}-WHAT-ROUND/bench.json already there")
    args = ap.parse_args()
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    runs: Dict[str, List[Dict[str, object]]] = {"a": [], "b": []}
    for v in runs if args.summarize_only else ():
        for f in sorted(args.out.glob(f"{v}-*-*/bench.json")):
            runs[v].append({"bench": json.loads(f.read_text()), "wall_s": None})
    for what in () if args.summarize_only else args.what:
        for r in range(args.rounds):
            for v, tree in trees.items():
                item = run_one(tree, what, args.out / f"{v}-{what}-{r + 1}", args.python)
                runs[v].append(item)
                print(f"{v} {what} round {r + 1}: {item['wall_s']} s", flush=True)
    machine = runs["b"][-1]["bench"].get("machine_line")
    summary = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "machine_line": machine,
               "a": {"tree": str(trees["a"]), "commit": git_head(trees["a"])},
               "b": {"tree": str(trees["b"]), "commit": git_head(trees["b"])},
               "rounds": {v: len(items) for v, items in runs.items()}, "rows": summarize(runs)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for k, row in summary["rows"].items():
        print(f"  {k:45s} A {row['a_img_s']:9.2f}  B {row['b_img_s']:9.2f}  B/A {row['b_over_a']:.3f} "
              f"(rounds {row['round_ratios']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
