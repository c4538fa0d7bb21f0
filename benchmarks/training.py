"""Training step: ViT-S/16 at 224 px and the small Fashion-MNIST model, vitkit vs timm, fp32 and bf16.

vitkit's step is the training engine's ``vitkit.train.TrainStep`` (fused AdamW, no-decay groups, global-norm
clipping at 1, bf16 = autocast); timm's is its ``VisionTransformer`` of the same configuration in a plain
PyTorch loop (``torch.optim.AdamW`` defaults, clipping at 1, the same autocast). Targets of issue 6:
>= 1.3x timm in bf16, >= 1.0x in fp32::

    flock /work/cpu.lock /work/peers/bin/python benchmarks/training.py
"""
from _common import main_guard, options, parser, run, verdict

SMALL = "recipe:fmnist-demo"


def main() -> None:
    p = parser(__doc__.splitlines()[0], "training")
    p.set_defaults(repeats=3)
    p.add_argument("--models", nargs="+", default=["S/16", SMALL])
    p.add_argument("--batch", type=int, nargs="+", default=None,
                   help="batch sizes (default: 16 for S/16, 256 for the Fashion-MNIST model)")
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--compile", choices=("off", "on", "both"), default="off")
    args = p.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 3)
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    results, checks = [], []
    base_out = args.out
    for model in args.models:
        batches = args.batch or ([256] if model.startswith("recipe:") else [16])
        args.out = f"{base_out}-{model.replace('/', '').replace(':', '-')}"
        res = run(["train"], [model], args, options(args),
                  train_batches=batches, dtypes=args.dtype, compiles=compiles)
        results.append(res)
        for dtype, need in (("bf16", 1.3), ("fp32", 1.0)):
            checks.append((res, dict(kind="train", model=model, dtype=dtype, need=need, peer="timm",
                                     label=f"{model} training step {dtype} vs timm")))
    for res, c in checks:
        verdict(res, [c])


if __name__ == "__main__":
    main_guard(main)
