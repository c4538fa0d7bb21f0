"""``vitkit backend``: the kernel plan a model gets on this machine, and why each choice was made."""
from __future__ import annotations

import json
import os

from ._util import add_command


def register(sub) -> None:
    p = add_command(sub, "backend", help="""
        the kernel plan vitkit runs a model with on this machine (GEMM library, training products, attention
        path, int8 engine, the head's tokens) and why each choice was made""", description="""
        Print the declared backend (--backend, $VITKIT_BACKEND, or auto) and the kernel plan a model of --model
        gets on this machine: every choice with its reason (declared, a measurement kept for this machine, or
        the static default where nothing is measured). Without --measure nothing is timed; with --measure every
        auto choice no measurement covers (or that was timed on a busy machine) is timed now on the model's
        shapes and kept in the measurement file, for every later model, prepare_inference, training run and
        server here.""")
    p.add_argument("--model", default="B/16", help="the model whose shapes to plan for (default B/16)")
    p.add_argument("--measure", action="store_true", help="time every auto choice not measured yet (and keep it)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench.machine import hardware
    from ..config import config_from_name
    from ..models.kernel_plan import ENV, current, default_cache_path, source
    from ..models.planner import plan

    kp = plan(config_from_name(args.model), measure=args.measure, retime_noisy=args.measure)
    report = {"declared": current().spec, "source": source(), "machine": hardware(), "model": args.model,
              "plan": kp.as_dict(), "cache": str(default_cache_path())}
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    print(f"declared   {report['declared']}  (from {report['source']}"
          + (f": ${ENV}={os.environ[ENV]!r})" if report["source"] == ENV else ")"))
    print(f"machine    {report['machine']}")
    rows = [(f"gemm {k}", v) for k, v in kp.gemm.items()] + [(f"training {k}", v) for k, v in kp.training.items()] \
        + [(f"attention {k}", v) for k, v in kp.attention.items()] + [("int8", kp.int8),
                                                                      ("head_tokens", kp.head_tokens or "all")]
    width = max(len(str(v)) for _, v in rows)
    for what, value in rows:
        print(f"{what:<28s} {str(value):<{width}s}  {kp.why.get(what, '')}")
    print(f"cache      {report['cache']}")
    return 0
