"""``vitkit pretrain-mpp``: masked patch prediction self-supervision (Section 4.6) on the training engine.

Fine-tune the result with ``vitkit finetune RUN/model --recipe ...``.
"""
from __future__ import annotations

from .train import add_run_args, overrides_of, resolve_run


def register(sub) -> None:
    from ..models.mpp import MPP_TARGETS

    p = sub.add_parser("pretrain-mpp", help="self-supervised pre-training by masked patch prediction (Section 4.6): "
                       "50%% of patch embeddings corrupted, predict their 3-bit mean colour; labels unused")
    add_run_args(p, "fmnist-mpp")
    p.add_argument("--target", choices=MPP_TARGETS,
                   help="mpp.target: mean_color (3-bit mean colour), color4x4 (4x4 downsampled, 3-bit), pixels (L2)")
    p.set_defaults(func=_pretrain)


def _pretrain(args) -> int:
    from ..train.mpp import pretrain_mpp

    ov = overrides_of(args)
    if args.target:
        ov["mpp.target"] = args.target
    run = resolve_run(args, ov)
    if run is None:
        return 0
    recipe, out = run
    res = pretrain_mpp(recipe, out, resume=args.resume, progress=not args.no_progress)
    if res and "test_mpp_loss" in res:
        ema = "_ema" if "test_mpp_loss_ema" in res else ""
        acc = res.get(f"test_mpp_acc{ema}")
        print(f"held-out MPP loss {res[f'test_mpp_loss{ema}']:.4f}"
              + (f", {100 * acc:.2f}% of corrupted patches' {recipe.mpp.target} targets right" if acc else "")
              + f" after {res['epochs']} epochs ({res['steps']} steps, {res['train_wall_s']:.0f} s)")
    if res and "model" in res:
        print(f"run folder: {out}  (model/ to fine-tune: vitkit finetune {out / 'model'} --recipe ...; mpp.png)")
    return 0
