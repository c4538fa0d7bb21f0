"""``vitkit bench``: speed and memory of vitkit and its peers (timm, Hugging Face, torchvision, and vitkit's own
exports run by ONNX Runtime and OpenVINO), side by side."""
from __future__ import annotations

import json
import shlex
import sys

from ..bench.peers import PEERS
from ..errors import UsageError
from ._util import add_command, nonneg_int, parse_overrides, positive_int

WHAT = ("inference", "latency", "train", "memory", "roofline")


def register(sub) -> None:
    p = add_command(sub, "bench", help="""
        throughput, latency, training steps, peak memory and GEMM roofline, against timm / HF / torchvision /
        ONNX Runtime / OpenVINO in the same run""", description="""
        Benchmark vitkit against timm, Hugging Face transformers (sdpa), torchvision, and vitkit's own ONNX export
        run by ONNX Runtime and by OpenVINO (inference only): the same configuration and weights, the same input
        and threads, repeats alternated; medians and spread, ratios vitkit / best peer, fraction of the GEMM
        roofline (GPU: MFU). Peers that are not installed are skipped with a note.""")
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="model names (B/16, S/16, vit_base_patch16_224, ...) or recipe:NAME (a training recipe's "
                        "model, e.g. recipe:fmnist-fast)")
    p.add_argument("--what", nargs="+", choices=WHAT, default=["inference", "latency"],
                   help="what to measure (default: inference latency)")
    p.add_argument("--img-size", type=positive_int, nargs="+", metavar="PX",
                   help="input resolutions (default: the model's own); e.g. 64 128 224 384 512 for Figure 12")
    p.add_argument("--batch", type=positive_int, nargs="+", default=[16], metavar="N",
                   help="inference batch sizes; each library is reported at its best one (default: 16)")
    p.add_argument("--train-batch", type=positive_int, nargs="+", default=[32], metavar="N",
                   help="training batch sizes")
    p.add_argument("--memory-batch", type=positive_int, nargs="+", default=[64], metavar="N",
                   help="batch sizes for peak memory (default: 64)")
    p.add_argument("--dtype", nargs="+", choices=("fp32", "bf16"), default=["fp32"],
                   help="precision; training bf16 = autocast (default: fp32)")
    p.add_argument("--compile", choices=("off", "on", "both"), default="off",
                   help="torch.compile every contender (default: off)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode, e.g. reduce-overhead (CUDA graphs) or max-autotune")
    p.add_argument("--peers", nargs="+", default=["all"], metavar="LIB",
                   help=f"{' '.join(PEERS)}, 'all' (default) or 'none'")
    p.add_argument("--peer-bf16", choices=("weights", "autocast"), default="weights",
                   help="how peers run bf16: bf16 weights (model.to(bfloat16), default) or fp32 weights + autocast")
    p.add_argument("--vitkit-module", action="store_true",
                   help="also time vitkit's model called directly (without prepare_inference's wrapper)")
    p.add_argument("--threads", type=positive_int, help="intra-op threads for every library (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--warmup", type=nonneg_int, default=1, help="untimed calls per contender first (default 1)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed repeats per contender, alternated (default 5)")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring the GEMM roofline")
    p.add_argument("--no-copy-weights", action="store_true",
                   help="peers keep their own random init instead of vitkit's weights")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--out", metavar="DIR", help="write bench.json and bench.png (Figure-12-style plot) here")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_bench)


def _bench(args) -> int:
    from ..bench import BenchOptions, format_result, parse_peers, run_bench

    for name, values in (("--batch", args.batch), ("--train-batch", args.train_batch),
                         ("--memory-batch", args.memory_batch)):
        if any(v < 1 for v in values):
            raise UsageError(f"{name} takes positive batch sizes, got {values}")
    if args.repeats < 1 or args.warmup < 0:
        raise UsageError("--repeats must be at least 1 and --warmup at least 0")
    if args.img_size and any(s < 1 for s in args.img_size):
        raise UsageError(f"--img-size takes positive sizes, got {args.img_size}")
    log = (lambda m: None) if args.quiet or args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    opts = BenchOptions(device=args.device, warmup=args.warmup, repeats=args.repeats,
                        peers=parse_peers(args.peers), roofline=not args.no_roofline, peer_bf16=args.peer_bf16,
                        copy_weights=not args.no_copy_weights,
                        vitkit_module=args.vitkit_module, compile_mode=args.compile_mode,
                        overrides=parse_overrides(args.set), log=log)
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    command = "vitkit " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if "bench" in sys.argv[1:2] else None
    result = run_bench(args.what, args.models, img_sizes=args.img_size or [None], batches=args.batch,
                       train_batches=args.train_batch, memory_batches=args.memory_batch, dtypes=args.dtype,
                       compiles=compiles, threads=args.threads, options=opts, out=args.out,
                       command=command)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(format_result(result))
        for key in ("json", "png"):
            if key in result:
                print(f"wrote {result[key]}")
    return 0
