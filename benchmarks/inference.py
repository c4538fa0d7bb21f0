"""Inference: ViT-B/16 at 224 px, vitkit vs timm / Hugging Face (sdpa) / torchvision, fp32 and bf16.

Throughput at each library's best batch size, latency at batch 1, the GEMM roofline of the model's own
shapes, and the targets of issue 6 (>= 1.25x the best peer in bf16, >= 1.05x in fp32, >= 85% of the
roofline in both). Needs the peers environment (timm, torchvision); missing peers are skipped::

    flock /work/cpu.lock /work/peers/bin/python benchmarks/inference.py --dtype fp32 --batch 8 32
    flock /work/cpu.lock /work/peers/bin/python benchmarks/inference.py --dtype bf16 --batch 8
    flock /work/cpu.lock /work/peers/bin/python benchmarks/inference.py --dtype fp32 --batch 8 --compile on
"""
from _common import RESULTS, main_guard, options, parser, run, verdict


def main() -> None:
    p = parser(__doc__.splitlines()[0], "inference")
    p.set_defaults(out=None)
    p.add_argument("--model", default="B/16")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--compile", choices=("off", "on", "both"), default="off")
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--vitkit-module", action="store_true", help="also time vitkit's plain nn.Module")
    args = p.parse_args()
    if args.quick:
        args.batch, args.repeats = args.batch[:1], min(args.repeats, 3)
    what = ["inference"] + ([] if args.no_latency else ["latency"])
    if args.out is None:  # one folder per setting, so runs of different settings do not overwrite each other
        args.out = str(RESULTS / f"inference-{args.model.replace('/', '')}-{'-'.join(args.dtype)}"
                       f"{'-compile-' + args.compile if args.compile != 'off' else ''}")
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    result = run(what, [args.model], args, options(args, vitkit_module=args.vitkit_module),
                 img_sizes=[args.img_size], batches=args.batch, dtypes=args.dtype, compiles=compiles)
    checks = []
    for dtype, need in (("bf16", 1.25), ("fp32", 1.05)):
        checks.append(dict(kind="inference", model=args.model, dtype=dtype, need=need,
                           label=f"{args.model} {args.img_size}px {dtype} inference vs best peer"))
        checks.append(dict(kind="inference", model=args.model, dtype=dtype, need=0.85, what="roofline",
                           label=f"{args.model} {args.img_size}px {dtype} inference roofline"))
    verdict(result, checks)


if __name__ == "__main__":
    main_guard(main)
