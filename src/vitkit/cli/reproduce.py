"""``vitkit reproduce``: the paper's ten claims as seeded small-scale experiments, and a report with verdicts."""
from __future__ import annotations

import shlex
import sys


def register(sub) -> None:
    from ..reproduce.claims import claims_table

    listing = "; ".join(f"{c.id} {c.title.split(' (')[0].lower()}" for c in claims_table().values())
    p = sub.add_parser("reproduce", help="test the paper's claims at laptop scale: train every arm (reusing "
                       "finished runs, resuming interrupted ones), then write OUT/report.md + report.json",
                       description=f"The claims: {listing}.")
    p.add_argument("--claims", default=None, metavar="1,2,...", help="claims to test (default: all ten)")
    p.add_argument("--budget", choices=["quick", "full"], default="quick",
                   help="quick: 2 seeds, short runs, <= 45 min on a 2-core CPU; full: 3 seeds, the real report "
                        "(many hours; resumable)")
    p.add_argument("--out", "-o", required=True, help="folder for the run folders and the report")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="train N runs at once, each in its own process with 1/N of the CPU cores (default 1); "
                        "small models use a many-core CPU better this way")
    p.add_argument("--report-only", action="store_true", help="train nothing: report on the finished runs")
    p.add_argument("--progress", action="store_true", help="a progress bar per run")
    p.set_defaults(func=_reproduce)


def _reproduce(args) -> int:
    from ..errors import UsageError
    from ..reproduce import reproduce
    from ..reproduce.claims import claims_table

    ids = None
    if args.claims:
        try:
            ids = [int(x) for x in args.claims.split(",") if x.strip()]
        except ValueError:
            ids = None
        known = claims_table()
        if not ids or any(i not in known for i in ids):
            raise UsageError(f"--claims {args.claims!r}: give claim numbers from 1 to {len(known)} separated by "
                             f"commas, e.g. --claims 1,3,8")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more processes")
    report = reproduce(args.out, ids, args.budget, jobs=args.jobs, command="vitkit " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                       progress=args.progress, report_only=args.report_only)
    for c in report["claims"]:
        print(f"claim {c['id']:2d}  {c['verdict']:12s}  {c['title']}")
    return 0
