"""What `make test` costs a new user: the disk of the environments it builds (and, with --run, its wall time and
closing lines); writes benchmarks/results/make-test.json, which the README quotes.

    python3 benchmarks/make_test.py                      # du -s of the environments in this checkout
    python3 benchmarks/make_test.py --root /path/to/checkout --out /tmp/make-test.json
    python3 benchmarks/make_test.py --run                # time `make test` whole first (then measure its disk)
    python3 benchmarks/make_test.py --root A --root B    # each environment from the first root that has it

The environments are those the Makefile builds: .venv (core + test extras), .venv-peers (timm, torchvision),
.venv-core (the core alone) and one .venv-extra-NAME per extra in the Makefile's EXTRAS. Each is measured with
`du -sk` on its own, and all together with one `du -sck` (a file hard-linked into two environments counts
once there). The Debian packages `make test` installs as root (Fashion-MNIST, Chromium) are counted from
dpkg's installed size when they are installed. An environment that does not exist is listed under
"missing", never guessed.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "results" / "make-test.json"
APT_PACKAGES = ("dataset-fashion-mnist", "chromium", "chromium-driver")


def environments(root: Path) -> List[str]:
    """The environment folders `make test` builds, from the Makefile's own variables."""
    text = (root / "Makefile").read_text()

    def var(name: str, default: str) -> str:
        m = re.search(rf"^{name} \?= *(.*)$", text, flags=re.M)
        return m.group(1).strip() if m else default

    extras = var("EXTRAS", "").split()
    return [var("VENV", ".venv"), var("PEERS", ".venv-peers"), var("CORE_ENV", ".venv-core")] + \
        [f".venv-extra-{e}" for e in extras]


def du_kib(paths: List[Path]) -> int:
    """Kibibytes on disk of ``paths`` together (``du -sck``: hard links counted once)."""
    out = subprocess.run(["du", "-sck", *map(str, paths)], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def apt_kib() -> Dict[str, int]:
    """dpkg's installed size (KiB) of the Debian packages `make test` installs, where they are installed."""
    if shutil.which("dpkg-query") is None:
        return {}
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Installed-Size} ${db:Status-Status}\n",
                          *APT_PACKAGES], capture_output=True, text=True).stdout
    return {p: int(s) for p, s, status in (line.split() for line in out.splitlines() if line.count(" ") == 2)
            if status == "installed" and s.isdigit()}


def machine_line() -> str:
    try:
        from vitkit.bench.machine import machine_line as line
        return line()
    except ImportError:  # run with a Python that has no vitkit: say what it is
        import platform
        return f"{platform.processor() or platform.machine()} | python {platform.python_version()} (no vitkit here)"


def run_make_test(root: Path) -> Dict[str, object]:
    t0 = time.perf_counter()
    proc = subprocess.run(["make", "test"], cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-12:]
    return {"command": "make test", "returncode": proc.returncode, "wall_s": round(wall, 1),
            "wall_min": round(wall / 60, 1), "closing_lines": tail}


def torch_build(env: Path) -> Optional[str]:
    """The torch version installed in ``env`` (its dist-info), if any: the CPU and CUDA builds differ in size."""
    found = sorted(env.glob("lib/python*/site-packages/torch-*.dist-info"))
    return found[0].name[len("torch-"):-len(".dist-info")] if found else None


def measure(roots: List[Path], run: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    names = environments(roots[0])
    where = {n: next((r / n for r in roots if (r / n).is_dir()), None) for n in names}
    present = [n for n in names if where[n] is not None]
    sizes = [{"name": n, "root": str(where[n].parent), "kib": du_kib([where[n]]), "torch": torch_build(where[n])}
             for n in present]
    for env in sizes:
        env["gib"] = round(env["kib"] / 2 ** 20, 2)
    total = du_kib([where[n] for n in present]) if present else 0
    apt = apt_kib()
    res = {"command": "python3 benchmarks/make_test.py" + "".join(f" --root {r}" for r in roots if r != ROOT),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "environments": sizes, "missing": [n for n in names if n not in present],
           "n_environments": len(present), "environments_total_kib": total,
           "environments_total_gib": round(total / 2 ** 20, 2),
           "apt_kib": apt, "apt_total_gib": round(sum(apt.values()) / 2 ** 20, 2),
           "machine_line": machine_line()}
    if run is not None:
        res["make_test"] = run
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, action="append", help="a checkout whose environments are measured "
                    "(repeatable: each environment from the first that has it; default: this checkout)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--run", action="store_true", help="run and time `make test` in ROOT first")
    args = ap.parse_args(argv)
    roots = [r.resolve() for r in args.root or [ROOT]]
    run = run_make_test(roots[0]) if args.run else None
    res = measure(roots, run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    tmp.replace(args.out)
    for env in res["environments"]:
        print(f"{env['name']:24s} {env['gib']:6.2f} GiB")
    print(f"{res['n_environments']} environments, {res['environments_total_gib']} GiB together"
          + (f"; missing: {' '.join(res['missing'])}" if res["missing"] else "") + f"; wrote {args.out}")
    return 0 if run is None or run["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
