"""Inference: ViT-B/16 at 224 px, vitkit vs timm / Hugging Face (sdpa) / torchvision / ONNX Runtime.

vitkit is ``prepare_inference(model, dtype)``, i.e. ``model.eval()`` in that dtype called under
``torch.inference_mode()`` (the model's own inference branch); the peers get the same weights, input and
threads, bf16 as bf16 weights, ONNX Runtime runs vitkit's model exported to ONNX (fp32). Throughput at each
library's best batch size, the GEMM roofline of the model's own shapes (MKL and oneDNN, same run), and the
verdict against the performance targets (benchmarks/verdict.py). Results under benchmarks/results/<machine kind>/::

    .venv-peers/bin/python benchmarks/inference.py --dtype fp32 bf16 --batch 16 32
    .venv-peers/bin/python benchmarks/inference.py --dtype fp32 --batch 16 --compile on   # inductor, freezing
"""
from _common import main_guard, options, out_folder, parser, run
from verdict import verdict


def main() -> None:
    p = parser(__doc__.splitlines()[0], "inference")
    p.add_argument("--model", default="B/16")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--compile", choices=("off", "on", "both"), default="off")
    p.add_argument("--latency", action="store_true", help="also batch-1 latency")
    args = p.parse_args()
    if args.quick:
        args.batch, args.repeats = args.batch[:1], min(args.repeats, 3)
    what = ["inference"] + (["latency"] if args.latency else [])
    out = out_folder(args, f"inference-{args.model.replace('/', '')}-{'-'.join(args.dtype)}"
                           f"{'-compile-' + args.compile if args.compile != 'off' else ''}")
    compiles = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    result = run(what, [args.model], args, options(args), out, img_sizes=[args.img_size], batches=args.batch,
                 dtypes=args.dtype, compiles=compiles)
    verdict(result)


if __name__ == "__main__":
    main_guard(main)
