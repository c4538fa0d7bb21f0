"""Peak memory of one inference call at batch 64: ViT-B/16 at 224 px, vitkit vs timm / HF / torchvision / ORT.

Each contender runs in a fresh process; the peak is the resident-set high-water mark during the call minus
the process's size before the model was built (weights + input + activations). Target (benchmarks/verdict.py): vitkit's
peak no higher than the best library peer's (ONNX Runtime, fp32 only, shown for reference)::

    .venv-peers/bin/python benchmarks/memory.py
"""
from _common import main_guard, options, out_folder, parser, run
from verdict import verdict


def main() -> None:
    p = parser(__doc__.splitlines()[0], "memory")
    p.add_argument("--models", nargs="+", default=["B/16"])
    p.add_argument("--img-size", type=int, nargs="+", default=[224])
    p.add_argument("--batch", type=int, nargs="+", default=[64])
    p.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    args = p.parse_args()
    result = run(["memory"], args.models, args, options(args), out_folder(args, "memory"),
                 img_sizes=args.img_size, memory_batches=args.batch, dtypes=args.dtype)
    verdict(result)


if __name__ == "__main__":
    main_guard(main)
