"""Figure 12 of the paper, on this machine: inference throughput vs input size (64-512 px) per model.

The paper's Figure 12 (left) plots images/s per core against input size for ViTs and ResNets on TPUv3; this
sweeps vitkit and its peers over the same sizes and draws the same plot (log-log), with peak memory per
resolution beside it when ``--memory`` is given::

    /work/peers/bin/python benchmarks/figure12.py
"""
from _common import main_guard, options, out_folder, parser, run


def main() -> None:
    p = parser(__doc__.splitlines()[0], "figure12")
    p.add_argument("--models", nargs="+", default=["S/16", "B/16"])
    p.add_argument("--img-size", type=int, nargs="+", default=[64, 128, 224, 384, 512])
    p.add_argument("--batch", type=int, nargs="+", default=[8])
    p.add_argument("--dtype", nargs="+", default=["fp32"])
    p.add_argument("--memory", action="store_true", help="also measure peak memory at each size (batch 8)")
    p.set_defaults(repeats=3, peers=["timm", "hf"])
    args = p.parse_args()
    if args.quick:
        args.img_size, args.repeats = [64, 224], 2
    what = ["inference"] + (["memory"] if args.memory else [])
    run(what, args.models, args, options(args, roofline=False), out_folder(args, "figure12"), img_sizes=args.img_size,
        batches=args.batch, memory_batches=args.batch, dtypes=args.dtype)


if __name__ == "__main__":
    main_guard(main)
