"""Time `make demo` as a new user meets it: a fresh clone, a new virtual environment, the install, the
training run and its test evaluation; writes docs/figures/training/fmnist-demo.json.

    python3 benchmarks/make_demo.py                 # clones HEAD of this checkout into a temporary folder
    python3 benchmarks/make_demo.py --backend gemm=onednn --out docs/figures/training/fmnist-demo-onednn.json

The JSON holds the wall time of the whole `make demo` (install included), the run's results.json (validation
scores, the exported weights, the one test evaluation), the lines the command printed last (the README shows
them) and the machine line. Fashion-MNIST must be
installed already (`make data`), as the demo's own time does not include fetching it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures" / "training" / "fmnist-demo.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the clone (its runs/demo/model for the figures)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--backend", metavar="SPEC", help="other kernels than the recipe's pinned ones: passed to the "
                    "demo's `vitkit train --backend` (make demo DEMO_ARGS=...)")
    args = ap.parse_args(argv)
    subprocess.run(["make", "-s", "data"], cwd=ROOT, check=True)
    work = Path(tempfile.mkdtemp(prefix="vitkit-demo-"))
    clone = work / "vitkit"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    t0 = time.perf_counter()
    make = ["make", "demo"] + ([f"DEMO_ARGS=--backend {args.backend}"] if args.backend else [])
    proc = subprocess.run(make, cwd=clone, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode:
        sys.stderr.write(proc.stderr[-3000:])
        print(f"make demo failed (exit {proc.returncode}); clone kept in {clone}", file=sys.stderr)
        return 1
    res = json.loads((clone / "runs" / "demo" / "results.json").read_text())
    machine = json.loads(subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c",
         "import json; from vitkit.bench.machine import machine_info; print(json.dumps(machine_info()))"],
        capture_output=True, text=True, check=True).stdout)
    command = shlex.join(make) + " (fresh clone, new .venv)"
    summary = {"command": command, "commit": commit, "wall_s": round(wall, 1),
               "wall_min": round(wall / 60, 2), "test_top1": res.get("test_top1"), "test_top5": res.get("test_top5"),
               "exported_weights": res.get("exported_weights"), "selected_by": res.get("selected_by"),
               "results": res, "closing_lines": proc.stdout.strip().splitlines()[-3:], "machine": machine,
               "targets": {"test_top1": 0.88, "wall_min": 10.0},
               "target_met": bool(res.get("test_top1", 0) >= 0.88 and wall < 600)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"make demo: {wall / 60:.1f} min with install, test top-1 {100 * res['test_top1']:.2f}% "
          f"({res['exported_weights']} weights); targets >= 88% in < 10 min "
          f"{'met' if summary['target_met'] else 'NOT met'}; wrote {args.out}")
    if args.keep:
        print(f"clone kept: {clone}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
