"""Peak memory of one inference call at batch 64: ViT-B/16 at 224 px, vitkit vs timm / HF / torchvision.

Each contender runs in a fresh process; the peak is the resident-set high-water mark during the call minus
the process's size before the model was built (weights + input + activations). Target of issue 6: vitkit's
peak no higher than the best peer's::

    flock /work/cpu.lock /work/peers/bin/python benchmarks/memory.py
"""
from _common import main_guard, options, parser, run, verdict


def main() -> None:
    p = parser(__doc__.splitlines()[0], "memory")
    p.add_argument("--models", nargs="+", default=["B/16"])
    p.add_argument("--img-size", type=int, nargs="+", default=[224])
    p.add_argument("--batch", type=int, nargs="+", default=[64])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    args = p.parse_args()
    result = run(["memory"], args.models, args, options(args), img_sizes=args.img_size,
                 memory_batches=args.batch, dtypes=args.dtype)
    verdict(result, [dict(kind="memory", model=m, dtype=d, img_size=s, need=1.0,
                          label=f"{m} {s}px batch {','.join(map(str, args.batch))} {d} peak memory vs best peer")
                     for m in args.models for d in args.dtype for s in args.img_size])


if __name__ == "__main__":
    main_guard(main)
