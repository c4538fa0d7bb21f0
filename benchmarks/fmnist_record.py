"""A pure ViT past ResNet-18 on Fashion-MNIST: the convolutional teacher, the distilled seeds, the paired
comparison without distillation and the ablations, with every number written to JSON.

    .venv/bin/python benchmarks/fmnist_record.py                       # teacher + 3 seeds x (distilled, plain)
    .venv/bin/python benchmarks/fmnist_record.py --arms all            # + the ablations (validation only)
    .venv/bin/python benchmarks/fmnist_record.py --smoke --data tensors:FILE --out /tmp/rec   # seconds

What it runs, one after another (each run step-driven, so a killed invocation continues where it stopped:
a finished run folder is reused, a started one resumed from its checkpoint; every invocation that trains a
run adds its wall time to the run's ledger, ``RUN.wall.json`` beside the folder, so a run spread over several
invocations, on one machine or carried between machines of one kind, still has its whole wall time):

1. the teacher, recipe ``fmnist-teacher``, once (``--teacher DIR`` reuses a finished run folder instead);
2. per seed (``--seeds``): the students' recipe (``--recipe``, default ``fmnist-record``: hard distillation
   through its distillation token from the teacher's exported weights) and, paired by seed, the same recipe
   without distillation (no teacher, no distillation token);
3. with ``--arms all``, for each ``--ablation-seeds``: soft distillation (DeiT's tau 3,
   alpha 0.1) and the recipe without each augmentation (RandAugment, Mixup, CutMix, random erasing,
   pad-crop + flip), judged on validation only.

The protocol: every run holds out the same 5,000 validation images; the trainer reads no test image
(``data.eval_split=null``); each teacher or main run's exported folder (``RUN/model``) is evaluated once on
the test split by vitkit's independent path (:func:`vitkit.train.evaluate_checkpoint`, what ``vitkit eval``
runs); the ablation runs never read the test split.

Written under ``--out`` (default ``docs/figures/training/RECIPE``): ``teacher.json``,
``{arm}-seed{N}.json`` per run (validation curve, validation scores of the raw and EMA weights, the exported
weights' test accuracy, training and wall time and, for the main arms, the wall time including this seed's
share of the teacher's) and ``summary.json`` (per-arm means and spreads, the paired differences, the
targets, the ablation table, the machine line, the command, the code version). ``--smoke``: tiny models for
a few steps, to prove the pipeline end to end (tests/test_fmnist_record.py).
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from vitkit.archive import DRAWN, WEIGHT_SUFFIXES, read_archive, write_archive
from vitkit.bench.machine import hardware, machine_info
from vitkit.cli._util import parse_overrides
from vitkit.errors import DataError
from vitkit.train import evaluate_checkpoint, load_recipe, train
from vitkit.train.runlog import read_metrics
from vitkit.utils import write_json_atomic
from vitkit.version import code_version

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures" / "training"  # FIGURES / RECIPE: the default --out of a recipe's record
TEACHER, STUDENT = "fmnist-teacher", "fmnist-record"
TARGET_TOP1 = 0.95  # mean of the seeds' test top-1, exported weights
BUDGET_S = 3 * 3600  # per seed, its share of the teacher's training included
MAIN_ARMS = {"distill": {}, "plain": {"distill.teacher": None, "model.distill_token": False}}
ABLATIONS = {
    "soft": {"distill.kind": "soft", "distill.tau": 3.0, "distill.alpha": 0.1},  # DeiT's soft distillation
    "no-randaugment": {"augment.randaugment": None},
    "no-mixup": {"augment.mixup": 0.0},
    "no-cutmix": {"augment.cutmix": 0.0},
    "no-erasing": {"augment.erasing": 0.0},
    "no-crop-flip": {"augment.crop": "none", "augment.flip": False},
}
# --smoke: the same pipeline on tiny models for a few steps (the data: --data, e.g. a tensors: file)
SMOKE = {"schedule.steps": 3, "schedule.warmup_steps": 1, "data.val_size": 40, "data.eval_batch_size": 64,
         "optim.batch_size": 16, "train.ckpt_every": 0, "train.predictions": 0, "train.log_every": 1,
         "train.eval_every": 0, "train.backend": "gemm=aten,attention=fused"}
SMOKE_TEACHER = {"model.backbone_layers": [1, 1], "model.width": 64}
SMOKE_STUDENT = {"model.width": 32, "model.depth": 1, "model.num_heads": 2, "model.mlp_dim": 64}


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    # a stop (``kill``, a lease's end) unwinds like Ctrl-C, so the run's ledger keeps the wall time it spent
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    argv = sys.argv[1:] if argv is None else argv
    command = "python benchmarks/fmnist_record.py " + " ".join(argv)
    out = Path(args.out) if args.out else FIGURES / args.recipe
    if args.smoke and not args.out:
        raise SystemExit("--smoke writes to --out only (never over the committed results): give --out")
    # the run folders (checkpoints: large, never committed): runs/ is ignored by git; a smoke run keeps its own
    runs = (Path(args.runs) if args.runs else out / "runs" if args.smoke else ROOT / "runs" / args.recipe).resolve()
    teacher_set, student_set = run_overrides(args)  # a bad --set fails here, before any training
    seeds = _ints(args.seeds)
    ablations = [a.strip() for a in args.ablations.split(",")] if args.ablations else list(ABLATIONS)
    unknown = [a for a in ablations if a not in ABLATIONS]
    if unknown:  # before any training
        raise SystemExit(f"--ablations: unknown arm {unknown[0]!r}; the arms: {', '.join(ABLATIONS)}")
    if args.state and Path(args.state).is_file():
        try:
            restored, _ = read_archive(args.state, runs, "runs", what="record state")
        except DataError as err:
            raise SystemExit(str(err)) from None
        print(f"{args.state}: {restored} files restored into {runs}", flush=True)

    def save() -> None:  # the state archive, rewritten after every run and when the invocation stops
        if args.state:
            write_archive(args.state, state_members(runs, out))
    try:
        return _run_all(args, command, out, runs, (teacher_set, student_set), seeds, ablations, save)
    finally:
        save()


def run_overrides(args) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The teacher's and the students' recipe overrides from the command line: one place, so the price
    script (benchmarks/fmnist_record_price.py) times the runs exactly as the record trains them."""
    common = {**(SMOKE if args.smoke else {}), **({"data.dataset": args.data} if args.data else {})}
    return ({**common, **(SMOKE_TEACHER if args.smoke else {}), **parse_overrides(args.teacher_set)},
            {**common, **(SMOKE_STUDENT if args.smoke else {}), **parse_overrides(args.set)})


def _run_all(args, command: str, out: Path, runs: Path, overrides: Tuple[Dict[str, Any], Dict[str, Any]],
             seeds: List[int], ablations: List[str], save) -> int:
    teacher = run_teacher(args, runs, overrides[0], out, command)
    save()
    student = {**overrides[1], "distill.teacher": str(teacher["model"])}
    share = teacher["wall_s"] / max(len(seeds), 1)  # each seed's part of the one teacher
    results: Dict[str, List[Dict[str, Any]]] = {}
    for seed in seeds:
        for arm, extra in MAIN_ARMS.items():
            res = run_student(arm, seed, {**student, **extra}, runs, out, test=True, teacher_share_s=share,
                              recipe=args.recipe, command=command)
            results.setdefault(arm, []).append(res)
            save()
    if args.arms == "all":
        for seed in _ints(args.ablation_seeds):
            for arm in ablations:
                res = run_student(arm, seed, {**student, **ABLATIONS[arm]}, runs, out, test=False,
                                  teacher_share_s=None, recipe=args.recipe, command=command)
                results.setdefault(arm, []).append(res)
                save()
    summary = summarise(teacher, results, seeds, command=command, smoke=args.smoke, name=args.recipe)
    write_json_atomic(out / "summary.json", summary)
    _plot(results, teacher, out / f"{args.recipe}.png", args.recipe)
    _print_summary(summary, out)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default=STUDENT, help=f"the students' recipe (default {STUDENT})")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds of the main arms (default 0,1,2)")
    ap.add_argument("--arms", default="main", choices=("main", "all"),
                    help="main: the distilled and the plain seeds; all: also the ablation arms")
    ap.add_argument("--ablation-seeds", default="0", help="seeds of the ablation arms (default 0)")
    ap.add_argument("--ablations", help=f"comma-separated ablation arms (default all: {', '.join(ABLATIONS)})")
    ap.add_argument("--teacher", help="a finished fmnist-teacher run folder to reuse (default: train one in "
                    "RUNS/teacher, or reuse it when it is there)")
    ap.add_argument("--runs", help="folder of the run folders (default runs/RECIPE; --smoke: OUT/runs)")
    ap.add_argument("--out", help=f"folder of the JSON files (default {FIGURES.relative_to(ROOT)}/RECIPE)")
    ap.add_argument("--data", help="data.dataset of every run (default the recipes': fashion-mnist)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="recipe overrides of every student run (e.g. schedule.epochs=100)")
    ap.add_argument("--teacher-set", action="append", default=[], metavar="KEY=VALUE",
                    help="recipe overrides of the teacher's run")
    ap.add_argument("--state", metavar="FILE.tar.gz",
                    help="the runs' portable state, for a record longer than one machine's lease: restored into "
                         "RUNS before anything trains (a file already there wins), rewritten after every run and "
                         "when the invocation stops (records and ledgers; the teacher's weights; a run's weights "
                         "until its JSON is written; an unfinished run's last checkpoint)")
    ap.add_argument("--smoke", action="store_true", help="tiny models for a few steps (a test of the pipeline)")
    return ap


def _ints(text: str) -> List[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def train_or_reuse(recipe_name: str, overrides: Dict[str, Any], folder: Path) -> Tuple[Dict[str, Any], str]:
    """(results.json, how: "reused" | "resumed" | "trained") of the run in ``folder``: reused when finished,
    resumed from its checkpoint when started, trained otherwise. The trainer reads no test image. A call that
    trains opens a segment in the run's ledger before it starts and closes it with its wall time when it
    ends, finished or stopped (an exception, Ctrl-C, SIGTERM); a process killed outright leaves it open."""
    done = folder / "results.json"
    if done.is_file() and (folder / "model").is_dir():
        return json.loads(done.read_text()), "reused"
    recipe = load_recipe(recipe_name, {**overrides, "data.eval_split": None})
    resume = (folder / "checkpoints" / "last.pt").is_file()
    segments = _segments(folder) + [{"resumed": resume, "wall_s": None, "ended": None, "machine": hardware()}]
    _write_segments(folder, segments)
    t0 = time.perf_counter()
    try:
        train(recipe, folder, resume=resume, progress=sys.stderr.isatty())
    finally:
        segments[-1].update(wall_s=round(time.perf_counter() - t0, 1),
                            ended="finished" if done.is_file() else "stopped")
        _write_segments(folder, segments)
    return json.loads(done.read_text()), "resumed" if resume else "trained"


def state_members(runs: Path, out: Path) -> List[Tuple[str, Path]]:
    """What the state archive holds, as (name, file): every run's records and ledger; weights where a later
    invocation reads them (the teacher's, which the students load; a finished run's until its JSON in ``out``
    is written, i.e. before its one test reading); an unfinished run's last checkpoint, which resumes it.
    Plots are drawn again, temporary files skipped."""
    files = sorted(f for f in runs.glob("*.wall.json") if f.is_file())
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []:
        finished = (folder / "results.json").is_file()
        weights = folder.name == "teacher" or not (out / f"{folder.name}.json").is_file()
        for f in sorted(folder.rglob("*")):
            rel = f.relative_to(folder)
            if f.is_symlink() or not f.is_file() or f.name.startswith(".") or f.suffix in DRAWN:
                continue
            if rel.parts[0] == "checkpoints":
                keep = not finished and rel.as_posix() == "checkpoints/last.pt"
            else:
                keep = weights or f.suffix not in WEIGHT_SUFFIXES
            if keep:
                files.append(f)
    return [("runs/" + f.relative_to(runs).as_posix(), f) for f in files]


def _ledger(folder: Path) -> Path:
    return folder.parent / f"{folder.name}.wall.json"


def _segments(folder: Path) -> List[Dict[str, Any]]:
    path = _ledger(folder)
    return list(json.loads(path.read_text())["segments"]) if path.is_file() else []


def _write_segments(folder: Path, segments: List[Dict[str, Any]]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_ledger(folder), {"run": str(folder), "segments": segments})


def wall_account(folder: Path) -> Optional[Dict[str, Any]]:
    """The run's wall time over every invocation that trained it (None: no ledger, e.g. a folder trained
    outside this script). Whole (``wall_complete``) when its first segment started the run afresh and every
    segment was closed; a resumed run's sum also holds each restart and the steps redone since the last
    checkpoint, so it is never less than one uninterrupted run would have taken."""
    segments = _segments(folder)
    if not segments:
        return None
    whole = not segments[0]["resumed"] and all(s["wall_s"] is not None for s in segments)
    return {"wall_s": round(sum(s["wall_s"] or 0.0 for s in segments), 1), "segments": len(segments),
            "wall_complete": whole, "machines": sorted({s.get("machine") or "?" for s in segments})}


def independent_test(model_dir: Path, recipe_name: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
    """The exported folder's one reading of the test split, through ``vitkit eval``'s path (the weights and
    preprocessing as saved, not the trainer's objects)."""
    data = load_recipe(recipe_name, overrides).data
    t0 = time.perf_counter()
    res = evaluate_checkpoint(model_dir, data.dataset, "test", root=data.root, batch_size=data.eval_batch_size)
    return {"top1": res["top1"], "top5": res["top5"], "loss": res["loss"], "images": res["n"],
            "eval_s": round(time.perf_counter() - t0, 1), "path": "vitkit.train.evaluate_checkpoint"}


def curve(folder: Path) -> List[Dict[str, Any]]:
    """The validation evaluations of a run (one row per step; a resumed run's later row wins)."""
    rows = {r["step"]: r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("split") == "val"}
    return [{"step": r["step"], "epoch": r.get("epoch"), "train_s": r.get("train_time"), "val_top1": r.get("top1"),
             "val_top1_ema": r.get("top1_ema"), "final": bool(r.get("final"))} for r in rows.values()]


def _record(name: str, recipe: str, seed: Optional[int], overrides: Dict[str, Any], folder: Path,
            res: Dict[str, Any], how: str, command: Optional[str]) -> Dict[str, Any]:
    """One run's JSON: what it was, its validation scores and curve, its times. ``wall_s`` is the run's wall
    time over every invocation that trained it (:func:`wall_account`; without a ledger, the trainer's last
    process, whole only when the run was not resumed), ``wall_complete`` whether it is whole; ``train_s``
    (training time, evaluations and checkpoints excluded) is whole either way."""
    resumed = how == "resumed"
    account = wall_account(folder) or {"wall_s": res.get("train_wall_s"), "segments": None,
                                       "wall_complete": not resumed, "machines": None}
    return {"name": name, "recipe": recipe, "seed": seed, "overrides": overrides, "run": str(folder),
            "how": how, "resumed": resumed or bool(account["segments"] and account["segments"] > 1),
            "wall_complete": account["wall_complete"], "segments": account["segments"],
            "trained_on": account["machines"],  # the kind of machine of each invocation that trained it
            "val": res.get("val"), "val_images": res.get("val_images"),
            "exported_weights": res.get("exported_weights"), "selected_by": res.get("selected_by"),
            "train_images": res.get("train_images"), "params": res.get("params"), "steps": res.get("steps"),
            "epochs": res.get("epochs"), "train_s": res.get("trained_s"),
            "wall_s": account["wall_s"],
            "backend": res.get("backend", {}).get("declared"), "teacher": res.get("teacher"),
            # a reused folder trained outside this script may have read the test split itself: said, not hidden
            "trainer_test_top1": res.get("test_top1"),
            "curve": curve(folder), "machine": machine_info(), "code": code_version(), "command": command}


def run_teacher(args, runs: Path, overrides: Dict[str, Any], out: Path, command: Optional[str] = None
                ) -> Dict[str, Any]:
    """The teacher, trained once (or reused), its exported weights tested once; teacher.json."""
    folder = Path(args.teacher) if args.teacher else runs / "teacher"
    res, how = train_or_reuse(TEACHER, overrides, folder.resolve())
    rec = _record("teacher", TEACHER, None, overrides, folder.resolve(), res, how, command)
    rec["model"] = str(folder.resolve() / "model")
    saved = out / "teacher.json"
    old = json.loads(saved.read_text()) if saved.is_file() and how == "reused" else {}
    _keep_first(rec, old)
    # the test split once per exported model: a reused teacher keeps the reading already made
    rec["test"] = old["test"] if _same_run(rec, old) and old.get("test") else \
        independent_test(folder / "model", TEACHER, overrides)
    write_json_atomic(saved, rec)
    print(f"teacher: test top-1 {100 * rec['test']['top1']:.2f}% ({rec['run']})", flush=True)
    return rec


def run_student(arm: str, seed: int, overrides: Dict[str, Any], runs: Path, out: Path, *, test: bool,
                teacher_share_s: Optional[float], recipe: str = STUDENT, command: Optional[str] = None
                ) -> Dict[str, Any]:
    """One student run of ``arm`` at ``seed`` of ``recipe`` (test read once, by the exported folder, when
    ``test``); ``command``: the invocation that wrote its record."""
    overrides = {**overrides, "train.seed": seed}
    folder = runs / f"{arm}-seed{seed}"
    res, how = train_or_reuse(recipe, overrides, folder)
    rec = _record(arm, recipe, seed, overrides, folder, res, how, command)
    saved = out / f"{arm}-seed{seed}.json"
    old = json.loads(saved.read_text()) if saved.is_file() and how == "reused" else {}
    _keep_first(rec, old)
    if test:
        rec["test"] = old["test"] if _same_run(rec, old) and old.get("test") else \
            independent_test(folder / "model", recipe, overrides)
    if teacher_share_s is not None and rec["wall_s"] is not None:
        rec["teacher_share_s"] = round(teacher_share_s, 1)
        rec["wall_with_teacher_s"] = round(rec["wall_s"] + teacher_share_s, 1)
    write_json_atomic(saved, rec)
    val = _val_top1(rec)
    print(f"{arm} seed {seed}: validation top-1 {100 * val:.2f}%"
          + (f", test top-1 {100 * rec['test']['top1']:.2f}%" if test else ""), flush=True)
    return rec


def _same_run(rec: Dict[str, Any], old: Dict[str, Any]) -> bool:
    """Whether ``old`` (the JSON already in OUT) records the run ``rec`` was just read from: the same folder
    name, validation scores and training time, wherever the runs folder now lies (a state restored on
    another machine) -- so a run's test split is read once, not once per machine."""
    return bool(old) and Path(old.get("run", "")).name == Path(rec["run"]).name and \
        old.get("val") == rec["val"] and old.get("train_s") == rec["train_s"]


def _keep_first(rec: Dict[str, Any], old: Dict[str, Any]) -> None:
    """A reused run's record keeps how it was first made, by which command on which machine (the invocation
    that wrote it and read its test split; ``trained_on`` names the machines that trained it) and, without a
    ledger, that call's times."""
    if _same_run(rec, old):
        first = ("how", "machine", "command")
        keys = first if rec["segments"] else first + ("resumed", "wall_complete", "wall_s")
        rec.update({k: old[k] for k in keys if k in old})


def _val_top1(rec: Dict[str, Any]) -> float:
    """The exported weights' validation top-1."""
    return float(rec["val"][rec["exported_weights"]]["top1"])


def _stats(values: List[float]) -> Dict[str, Any]:
    """Mean, sample standard deviation and the 95 % t interval of the mean (None where undefined; the interval
    needs scipy, vitkit's reproduce extra): :func:`vitkit.reproduce.stats.summary`'s numbers."""
    from vitkit.reproduce.stats import summary

    try:
        s = summary(values)
    except ImportError:  # no scipy (the reproduce extra): no interval
        s = {"mean": statistics.fmean(values) if values else None,
             "std": statistics.stdev(values) if len(values) > 1 else None, "ci": None}
    return {"n": len(values), "mean": s["mean"], "std": s["std"], "ci95": s["ci"], "values": values}


def _paired_p(d: Dict[str, Any]) -> Optional[float]:
    """One-sided p-value of a paired t-test that the mean difference is above 0 (None: fewer than 2 pairs, no
    spread, or no scipy)."""
    if d["std"] is None or d["std"] == 0:
        return None
    try:
        from vitkit.reproduce.stats import t_tail

        return t_tail(d["mean"] / (d["std"] / math.sqrt(d["n"])), d["n"] - 1)
    except ImportError:
        return None


def summarise(teacher: Dict[str, Any], results: Dict[str, List[Dict[str, Any]]], seeds: List[int], *,
              command: str, smoke: bool, name: str = STUDENT) -> Dict[str, Any]:
    """summary.json: the arms' test and validation scores, the paired differences, the targets, the ablation
    table, the machine line, the command and the code."""
    arms: Dict[str, Any] = {}
    for arm, recs in results.items():
        entry = {"seeds": [r["seed"] for r in recs], "val_top1": _stats([_val_top1(r) for r in recs])}
        if all("test" in r for r in recs):
            entry["test_top1"] = _stats([r["test"]["top1"] for r in recs])
            entry["wall_with_teacher_s"] = [r.get("wall_with_teacher_s") for r in recs]
        arms[arm] = entry
    dist = {r["seed"]: r for r in results.get("distill", [])}
    plain = {r["seed"]: r for r in results.get("plain", [])}
    paired = [dist[s]["test"]["top1"] - plain[s]["test"]["top1"] for s in seeds if s in dist and s in plain]
    diff = _stats(paired)
    diff["p_one_sided"] = _paired_p(diff)  # H1: distillation raises the test top-1 (paired t, n - 1 df)
    spread = max((arms[a]["test_top1"]["std"] or 0.0) for a in ("distill", "plain") if a in arms) if paired else None
    walls = [w for w in arms.get("distill", {}).get("wall_with_teacher_s", []) if w is not None]
    whole = all(r.get("wall_complete") for r in results.get("distill", [])) and teacher.get("wall_complete")
    mean_top1 = arms.get("distill", {}).get("test_top1", {}).get("mean")
    targets = {
        "mean_test_top1_at_least": TARGET_TOP1, "mean_test_top1": mean_top1,
        "top1_met": mean_top1 is not None and mean_top1 >= TARGET_TOP1,
        "budget_s_per_seed": BUDGET_S, "max_wall_with_teacher_s": max(walls) if walls else None,
        # judged only when every distilled seed's and the teacher's wall time is whole (their ledgers)
        "budget_met": (bool(walls) and max(walls) <= BUDGET_S) if whole else None,
        # the kinds of machine those wall times were spent on (the budget is stated for one kind)
        "budget_machines": sorted({m for r in [teacher, *results.get("distill", [])]
                                   for m in r.get("trained_on") or []}),
        # the distilled student beats the plain one, paired by seed, by more than the seeds' spread
        "paired_min_difference": min(paired) if paired else None, "seed_spread": spread,
        "margin_met": bool(paired) and len(paired) > 1 and min(paired) > (spread or 0.0)}
    ablation = {arm: {str(r["seed"]): _val_top1(r) for r in recs} for arm, recs in results.items()}
    return {"name": name, "smoke": smoke, "teacher": {k: teacher.get(k) for k in (
                "run", "model", "test", "val", "exported_weights", "train_s", "wall_s", "params")},
            "arms": arms, "paired_difference_test_top1": diff, "targets": targets,
            "ablation_val_top1": ablation, "machine": machine_info(), "code": code_version(), "command": command}


def _plot(results: Dict[str, List[Dict[str, Any]]], teacher: Dict[str, Any], path: Path, title: str) -> None:
    """The validation curves of the main arms, one line per seed, and the teacher's test accuracy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for arm, style in (("distill", "-"), ("plain", "--")):
        for rec in results.get(arm, []):
            pts = [(p["epoch"], 100 * p["val_top1"]) for p in rec["curve"] if p["val_top1"] is not None]
            if pts:
                ax.plot(*zip(*pts), style, marker="o", ms=2, label=f"{arm}, seed {rec['seed']}")
    ax.axhline(100 * teacher["test"]["top1"], color="gray", lw=0.8, ls=":", label="teacher, test")
    ax.axhline(100 * TARGET_TOP1, color="red", lw=0.8, ls=":", label=f"target {100 * TARGET_TOP1:g} %")
    ax.set(xlabel="epoch", ylabel="validation top-1 (%), raw weights", title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_summary(summary: Dict[str, Any], out: Path) -> None:
    t = summary["targets"]
    word = lambda ok: "not judged (a wall time not whole)" if ok is None else "met" if ok else "NOT met"  # noqa: E731
    if t["mean_test_top1"] is not None:
        print(f"distilled: mean test top-1 {100 * t['mean_test_top1']:.2f}% (target {100 * TARGET_TOP1:g}%: "
              f"{word(t['top1_met'])}); budget {word(t['budget_met'])}; "
              f"margin over the plain arm {word(t['margin_met'])}")
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    sys.exit(main())
