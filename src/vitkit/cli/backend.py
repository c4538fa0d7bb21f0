"""``vitkit backend``: the declared backend, what ``auto`` resolves to on this machine, and the measurements."""
from __future__ import annotations

import json

from ._util import add_command


def register(sub) -> None:
    p = add_command(sub, "backend", help="""
        the kernels vitkit runs on this machine (GEMM library, attention path, int8 engine) and the measurements
        behind each auto choice""", description="""
        Print the declared backend (--backend, $VITKIT_BACKEND, or auto), what each auto field resolves to on
        this machine for a model's shapes, and the measurement behind each choice. Without --measure nothing is
        timed: choices not yet measured say so (the first model call that needs one measures it); with --measure
        the choices are timed now and cached (for B/16: under a minute on a 2-core AMD EPYC).""")
    p.add_argument("--model", default="B/16", help="the model whose shapes to resolve (default B/16)")
    p.add_argument("--batch", type=int, default=16, help="images per call for the attention shapes (default 16)")
    p.add_argument("--measure", action="store_true", help="time every auto choice now (and cache it)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..models.resolve import resolve_backend

    report = resolve_backend(args.model, batch=args.batch, measure=args.measure)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    print(f"declared   {report['declared']}  (from {report['source']})")
    if report.get("environment"):
        print(f"           ${report['environment']['variable']}={report['environment']['value']!r} fixes "
              f"{', '.join(report['environment']['fixes']) or 'nothing'}")
    print(f"machine    {report['machine']}")
    width = max([10] + [len(str(row["choice"] or "-")) for row in report["choices"]])
    for row in report["choices"]:
        extra = f"  [{row['measurement']}]" if row.get("measurement") else ""
        print(f"{row['what']:<46s} {str(row['choice'] or '-'):<{width}s} {row['why']}{extra}")
    print(f"cache      {report['cache']}")
    return 0
