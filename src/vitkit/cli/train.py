"""Training commands: ``train``, ``finetune``, ``eval``, ``recipes``.

Distributed: run the same command under ``torchrun --nproc_per_node N -m vitkit train ...``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import UsageError
from ..train.recipe import DEFAULT_RECIPE
from ._util import ManyFiles, nonneg_int, parse_overrides, positive_float, positive_int


def add_run_args(p, default_recipe: str) -> None:
    """The options every training command takes (recipe, overrides, data, length, run folder)."""
    p.add_argument("--recipe", "-r", default=None,
                   help=f"built-in recipe name or a .yaml/.json file (default: {default_recipe}, or with --resume the "
                   f"run's own recipe.yaml; list: vitkit recipes)")
    p.set_defaults(default_recipe=default_recipe)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value: optim.lr=3e-4, schedule.epochs=20, width=192 ... (repeatable)")
    p.add_argument("--data", metavar="SPEC", help="dataset: fashion-mnist[:DIR], mnist[:DIR], cifar10:DIR, "
                   "cifar100:DIR, folder:DIR, shards:PATTERN, tensors:FILE")
    p.add_argument("--epochs", type=positive_float, help="schedule.epochs")
    p.add_argument("--steps", type=positive_int, help="schedule.steps (wins over epochs)")
    p.add_argument("--lr", type=positive_float, help="optim.lr (peak)")
    p.add_argument("--batch-size", type=positive_int, help="optim.batch_size (global)")
    p.add_argument("--device", help="train.device: auto, cpu, cuda, cuda:N")
    p.add_argument("--out", "-o", help="run folder (default: runs/<recipe>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the resolved recipe and exit without training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a ViT from a recipe (from scratch, or fine-tune with init.checkpoint)")
    add_run_args(p, DEFAULT_RECIPE)
    p.set_defaults(func=_train)

    p = sub.add_parser("finetune", help="fine-tune a checkpoint (any format vitkit loads) the paper's way: "
                       "new zero head, position embeddings resized to the new resolution")
    p.add_argument("checkpoint", help="weights to start from: a vitkit folder, timm/torchvision/HF file, .npz")
    p.add_argument("--img-size", type=positive_int, help="fine-tuning resolution (position embeddings are resized)")
    add_run_args(p, "paper-finetune")
    p.set_defaults(func=_finetune)

    p = sub.add_parser("eval", help="top-1/top-5 accuracy of a checkpoint on a dataset, with its preprocessing")
    p.add_argument("checkpoint", help="a vitkit model folder (e.g. RUN/model) or any weights vitkit loads")
    p.add_argument("--data", required=True, metavar="SPEC", help="dataset spec, as for vitkit train")
    p.add_argument("--split", default="test", help="split to evaluate (default: test)")
    p.add_argument("--root", help="dataset folder for specs without a path")
    p.add_argument("--batch-size", type=positive_int, default=500)
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", type=nonneg_int, default=0, help="decoding processes for image folders / shards")
    p.add_argument("--tta", choices=["none", "flip"], default="none",
                   help="test-time augmentation: flip scores each image by the mean probability of it and its "
                        "mirror image (default: none)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)

    p = sub.add_parser("recipes", help="list the built-in recipes, or print one resolved (with --set overrides)")
    p.add_argument("name", nargs="?", help="recipe name or file to print")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--save", metavar="FILE", help="write the resolved recipe to FILE (.yaml or .json)")
    p.set_defaults(func=_recipes)


def overrides_of(args) -> dict:
    """The recipe overrides of a training command: ``--set`` pairs plus the shortcut options."""
    ov = parse_overrides(args.set)
    for flag, key in (("data", "data.dataset"), ("epochs", "schedule.epochs"), ("steps", "schedule.steps"),
                      ("lr", "optim.lr"), ("batch_size", "optim.batch_size"), ("device", "train.device"),
                      ("backend", "train.backend")):  # the command line wins over a recipe that pins kernels
        v = getattr(args, flag, None)
        if v is not None:
            ov[key] = v
    return ov


def resolve_run(args, ov: dict):
    """(recipe, run folder) of a training command (``train``, ``finetune``, ``pretrain-mpp``): ``--recipe``,
    else the run's own saved recipe when resuming, else the command's default; with ``--set`` overrides.
    With ``--print-only`` the resolved recipe is printed and None returned."""
    from ..train import load_recipe

    name = args.recipe
    if name is None:
        saved = Path(args.out) / "recipe.yaml" if args.out else None
        name = saved if args.resume and saved is not None and saved.is_file() else args.default_recipe
    recipe = load_recipe(name, ov)
    if args.print_only:
        print(recipe.to_yaml(), end="")
        return None
    if args.resume and not args.out:
        raise UsageError("--resume needs --out RUN_FOLDER (the run to continue)")
    out = Path(args.out) if args.out else Path("runs") / f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return recipe, out


def _run(args, ov: dict) -> int:
    from ..train import train

    run = resolve_run(args, ov)
    if run is None:
        return 0
    recipe, out = run
    res = train(recipe, out, resume=args.resume, progress=not args.no_progress)
    if res:
        print_report(res, out)
    return 0


def print_report(res: dict, out: Path) -> None:
    """The closing lines of a training command: validation, test accuracy, the run folder's files (the README
    shows them for `make demo`'s measured run)."""
    import os
    if int(os.environ.get("RANK", "0")) != 0:
        return
    kind = res.get("exported_weights", "raw")
    val = (res.get("val") or {}).get(kind)
    time_part = f"after {res['epochs']} epochs ({res['steps']} steps, {res['trained_s']:.0f} s of training)"
    if val is not None:
        print(f"validation: {100 * val['top1']:.2f}% top-1 with the {kind} weights, exported "
              f"({res.get('selected_by', '')})")
    if res.get("test_top1") is not None:
        print(f"test accuracy: {100 * res['test_top1']:.2f}% top-1, {100 * res['test_top5']:.2f}% top-5 "
              f"({res.get('test_images', '?')} test images, {kind} weights) {time_part}")
    elif val is None:
        print(f"trained {time_part}; no validation or test split to evaluate on")
    made = [name for name in ("model/", "curves.png", "predictions.png", "metrics.jsonl", "results.json")
            if (out / name).exists()]
    print(f"run folder: {out}  ({', '.join(made)})")


def _train(args) -> int:
    return _run(args, overrides_of(args))


def _finetune(args) -> int:
    ov = overrides_of(args)
    ov["init.checkpoint"] = args.checkpoint
    if args.img_size:
        ov["model.img_size"] = args.img_size
    return _run(args, ov)


def _eval(args) -> int:
    from ..train import evaluate_checkpoint

    res = evaluate_checkpoint(args.checkpoint, args.data, args.split, root=args.root, batch_size=args.batch_size,
                              device=args.device, workers=args.workers, tta=args.tta,
                              progress=not args.no_progress)
    many = ManyFiles("eval")  # an image folder with unreadable files: each reported, the rest evaluated
    for bad in res.get("unreadable", []):
        many.skip(bad["path"], bad["error"])
    many.ok = res["n"]
    if not res["n"]:
        return many.exit_code("images", "evaluated")
    if args.json:
        print(json.dumps(res))
    else:
        tta = ", flip TTA" if args.tta == "flip" else ""
        print(f"{args.data} [{args.split}, {res['n']} images{tta}]: top-1 {100 * res['top1']:.2f}%, "
              f"top-5 {100 * res['top5']:.2f}%, loss {res['loss']:.4f}")
    return many.exit_code("images", "evaluated")


def _recipes(args) -> int:
    from ..train import list_recipes, load_recipe
    from ..train.recipe import raw_recipe

    if not args.name:
        for name in list_recipes():
            desc = " ".join(str(raw_recipe(name).get("description", "")).split())
            print(f"{name:18s} {desc[:100]}{'...' if len(desc) > 100 else ''}")
        return 0
    recipe = load_recipe(args.name, parse_overrides(args.set))
    if args.save:
        recipe.save(args.save)
        print(f"wrote {args.save}")
    else:
        print(recipe.to_yaml(), end="")
    return 0
