"""Shared by the benchmark scripts: run vitkit.bench, print the report and the verdict against the targets.

Run the scripts from the repository root with the environment that has the peers installed, under the
CPU lock when others share the machine, e.g.::

    /work/peers/bin/python benchmarks/inference.py
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

from vitkit.bench import BenchOptions, format_result, parse_peers, run_bench

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str, name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=None, help="folder for bench.json / bench.png (default: under "
                   "benchmarks/results/<machine kind>/)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads for every library")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--peers", nargs="+", default=["all"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="a short run (fewer repeats and sizes) to try things")
    return p


def out_folder(args, name: str) -> str:
    return args.out or str(kind_folder() / name)


def options(args, **kw) -> BenchOptions:
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    return BenchOptions(device=args.device, warmup=args.warmup, repeats=args.repeats,
                        peers=parse_peers(args.peers), log=log, **kw)


def run(what: Sequence[str], models: Sequence[str], args, opts: BenchOptions, out: str, **kw):
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    result = run_bench(what, models, threads=args.threads, options=opts, out=out, command=command, **kw)
    print(f"command: {command}")
    print(format_result(result))
    for key in ("json", "png"):
        if key in result:
            print(f"wrote {result[key]}")
    return result


def machine_kind() -> str:
    """The machine kind results are kept under: CPU vendor and its widest matrix instructions (results of
    one kind do not carry over to another), e.g. ``intel-amx``, ``amd-avx512-bf16``, ``amd-avx2``."""
    from vitkit.bench import machine_info

    info = machine_info()
    cpu = info["host_cpu"].lower()
    vendor = "intel" if "intel" in cpu or "xeon" in cpu else "amd" if "amd" in cpu or "epyc" in cpu else "cpu"
    isa = info["isa"]
    level = ("amx" if "amx_bf16" in isa else "avx512-bf16" if "avx512_bf16" in isa else
             "avx512" if "avx512f" in isa else "avx2" if "avx2" in isa else "generic")
    return f"{vendor}-{level}"


def kind_folder() -> Path:
    return RESULTS / machine_kind()


def main_guard(fn) -> None:
    try:
        fn()
    except KeyboardInterrupt:
        sys.exit(130)
