"""Training step: ViT-S/16 at 224 px and the fmnist-demo network, vitkit vs timm, fp32 and bf16 autocast.

vitkit's step is the training engine's ``vitkit.train.TrainStep`` (AdamW, no-decay groups, global-norm
clipping at 1, bf16 = autocast); timm's is its ``VisionTransformer`` of the same configuration in a plain
PyTorch loop with the *same* optimiser implementation (``torch.optim.AdamW(fused=True)`` where torch has
the fused kernel, else ``foreach``; the same decay / no-decay split), clipping at 1 and the same autocast,
so the ratio measures the model code. Verdict against the target (>= 1.10x timm, benchmarks/verdict.py)::

    .venv-peers/bin/python benchmarks/training.py
"""
from _common import main_guard, options, out_folder, parser, run
from verdict import verdict

SMALL = "recipe:fmnist-demo"


def main() -> None:
    p = parser(__doc__.splitlines()[0], "training")
    p.set_defaults(repeats=5)
    p.add_argument("--models", nargs="+", default=["S/16", SMALL])
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="batch sizes (default: 16 for S/16, 256 for the Fashion-MNIST model)")
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--compile", choices=("off", "on", "both"), default="off")
    p.set_defaults(peers=["timm"])  # training steps are compared with timm (the target's reference)
    args = p.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 3)
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    results = []
    for model in args.models:
        batches = args.batch or ([256] if model.startswith("recipe:") else [16])
        out = out_folder(args, f"training-{model.replace('/', '').replace(':', '-')}"
                               f"{'-compile-' + args.compile if args.compile != 'off' else ''}")
        results.append(run(["train"], [model], args, options(args), out,
                           train_batches=batches, dtypes=args.dtype, compiles=compiles))
    verdict(results)


if __name__ == "__main__":
    main_guard(main)
