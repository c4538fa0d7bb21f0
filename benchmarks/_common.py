"""Shared by the benchmark scripts: run vitkit.bench, print the report and the verdict against the targets.

Run the scripts from the repository root with the environment that has the peers installed, under the
CPU lock when others share the machine, e.g.::

    flock /work/cpu.lock /work/peers/bin/python benchmarks/inference.py
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from vitkit.bench import BenchOptions, format_result, parse_peers, run_bench

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str, name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=str(RESULTS / name), help="folder for bench.json / bench.png")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads for every library")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--peers", nargs="+", default=["all"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="a short run (fewer repeats and sizes) to try things")
    return p


def options(args, **kw) -> BenchOptions:
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    return BenchOptions(device=args.device, warmup=args.warmup, repeats=args.repeats,
                        peers=parse_peers(args.peers), log=log, **kw)


def run(what: Sequence[str], models: Sequence[str], args, opts: BenchOptions, **kw):
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    result = run_bench(what, models, threads=args.threads, options=opts, out=args.out, command=command, **kw)
    print(f"command: {command}")
    print(format_result(result))
    for key in ("json", "png"):
        if key in result:
            print(f"wrote {result[key]}")
    return result


def verdict(result, checks: List[Dict]) -> List[str]:
    """Each check: kind, model, dtype, (compile), need (ratio), what ('ratio' or 'roofline'), label.

    Takes the best vitkit setting (eager or compiled) against the best peer setting of the same dtype."""
    lines = []
    comps = result["comparisons"]
    for c in checks:
        group = [x for x in comps if x["kind"] == c["kind"] and x["model"] == c["model"] and x["dtype"] == c["dtype"]
                 and (c.get("img_size") is None or x["img_size"] == c["img_size"])]
        if not group:
            lines.append(f"{c['label']}: not measured")
            continue
        if c.get("what") == "roofline":  # the fraction of the setting in which vitkit was fastest
            measured = [x for x in group if "roofline_fraction" in x]
            if not measured:
                lines.append(f"{c['label']}: no roofline measured")
                continue
            fastest = max(measured, key=lambda x: x["libraries"]["vitkit"]["images_per_s"])
            value = fastest["roofline_fraction"]
            ok = value >= c["need"]
            lines.append(f"{c['label']}: {value:.0%} of the roofline (target {c['need']:.0%}) -> "
                         f"{'met' if ok else 'NOT met'}")
            continue
        if c["kind"] == "memory":
            mine = min(x["libraries"]["vitkit"]["peak_mib"] for x in group if "vitkit" in x["libraries"])
            peers = [v["peak_mib"] for x in group for k, v in x["libraries"].items() if k not in ("vitkit",)]
            if not peers:
                lines.append(f"{c['label']}: no peer measured")
                continue
            ratio = mine / min(peers)
            ok = ratio <= c["need"]
            lines.append(f"{c['label']}: vitkit {mine:.0f} MiB vs best peer {min(peers):.0f} MiB = {ratio:.2f}x "
                         f"(target <= {c['need']:.2f}x) -> {'met' if ok else 'NOT met'}")
            continue
        mine = max(x["libraries"]["vitkit"]["images_per_s"] for x in group if "vitkit" in x["libraries"])
        peer_vals = {(k, x["compile"]): v["images_per_s"] for x in group for k, v in x["libraries"].items()
                     if k not in ("vitkit", "vitkit-module") and (c.get("peer") in (None, k))}
        if not peer_vals:
            lines.append(f"{c['label']}: no peer measured")
            continue
        (lib, comp), best = max(peer_vals.items(), key=lambda kv: kv[1])
        ratio = mine / best
        ok = ratio >= c["need"]
        lines.append(f"{c['label']}: vitkit {mine:.2f} img/s vs {lib}{' (compiled)' if comp else ''} {best:.2f} = "
                     f"{ratio:.2f}x (target {c['need']:.2f}x) -> {'met' if ok else 'NOT met'}")
    print("\n".join(["", "targets:"] + ["  " + x for x in lines]))
    return lines


def main_guard(fn) -> None:
    try:
        fn()
    except KeyboardInterrupt:
        sys.exit(130)
