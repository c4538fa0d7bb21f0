"""``vitkit reproduce``: the paper's ten claims as seeded small-scale experiments, and a report with verdicts."""
from __future__ import annotations

import shlex
import sys


def register(sub) -> None:
    from ..reproduce.catalog import claims_table

    listing = "; ".join(f"{c.id} {c.title.split(' (')[0].lower()}" for c in claims_table().values())
    p = sub.add_parser("reproduce", help="test the paper's claims at laptop scale: train every arm (reusing "
                       "finished runs, resuming interrupted ones), then write OUT/report.md + report.json",
                       description=f"The claims: {listing}.")
    p.add_argument("--claims", default=None, metavar="1,2,...", help="claims to test (default: all ten)")
    p.add_argument("--budget", choices=["quick", "full"], default="quick",
                   help="quick: the pilot (3 seeds, short runs of the primary hypotheses' arms): it prints what each "
                        "claim can show before training and ends with each primary's spread and the seeds the full "
                        "budget needs; full: the campaign, 5 to 20 seeds per arm as its power analysis plans them "
                        "before training, and a learning-rate sweep per architecture (many hours; resumable). "
                        "docs/reproduction/README.md gives each budget's estimated cost")
    p.add_argument("--pilot", default=None, metavar="PILOT/report.json",
                   help="with --budget full: the pilot's report, whose spreads (pooled with the v2 campaign's) size "
                        "the seeds per arm; without it the v2 campaign's spreads alone do")
    p.add_argument("--out", "-o", required=True, help="folder for the run folders and the report")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="train N runs at once, each in its own process with 1/N of the CPU cores (default 1); "
                        "small models use a many-core CPU better this way")
    p.add_argument("--report-only", action="store_true", help="train nothing: report on the finished runs")
    p.add_argument("--allow-mixed-code", action="store_true",
                   help="compare runs trained by different code versions (refused by default; the report lists them)")
    p.add_argument("--allow-missing-seeds", action="store_true",
                   help="compare arms whose seeds differ, unpaired (refused by default; the report lists them)")
    p.add_argument("--state", default=None, metavar="FILE.tar.gz",
                   help="the campaign's portable state, for a campaign longer than one machine's lease: runs in "
                        "FILE that OUT lacks are restored before anything trains, and FILE is rewritten after every "
                        "finished run with each run's records and only the weights a run still to come needs")
    p.add_argument("--progress", action="store_true", help="a progress bar per run")
    p.set_defaults(func=_reproduce)


def _reproduce(args) -> int:
    from ..errors import UsageError
    from ..reproduce import reproduce
    from ..reproduce.catalog import claims_table

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
    if args.pilot and args.budget != "full":
        raise UsageError("--pilot sizes the full budget: give it with --budget full")
    command = "vitkit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = reproduce(args.out, ids, args.budget, jobs=args.jobs, command=command,
                       progress=args.progress, report_only=args.report_only, allow_mixed_code=args.allow_mixed_code,
                       allow_missing_seeds=args.allow_missing_seeds, state=args.state, pilot=args.pilot)
    if report.get("pilot"):
        for cid, r in report["pilot"]["design"]["claims"].items():
            need = f"{r['seeds']} seeds" if r["testable"] else "not testable at the full budget"
            print(f"claim {int(cid):2d}  full budget: {need:32s}  {_title(report, cid)}")
        return 0
    for c in report["claims"]:
        print(f"claim {c['id']:2d}  {c['verdict']:32s}  {c['title']}")
    return 0


def _title(report, cid) -> str:
    return next(c["title"] for c in report["claims"] if str(c["id"]) == str(cid))
