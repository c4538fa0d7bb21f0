"""The served torch path against prepare_inference: the same computation at the same speed.

``vitkit serve``'s torch engine (``TorchEngine.run``: logits and pooled features from one
``forward_outputs`` pass) and the module ``prepare_inference`` returns (what ``vitkit bench`` times) run
ViT-B/16 at 224 px on the same weights and inputs, alternated round by round (``vitkit.timing.alternate``),
in fp32 and in bf16 where the CPU multiplies it natively. The JSON holds each path's images/s, the ratio
served / prepared, whether the logits are identical, and each path's kernel plan::

    .venv/bin/python benchmarks/served_path.py            # benchmarks/results/<machine kind>/served_path.json
"""
import copy
import shlex
import sys

import torch

from _common import kind_folder
from vitkit.bench import machine_line
from vitkit.bench.models import build_model, example_batch, model_config
from vitkit.models.inference import prepare_inference
from vitkit.models.ops import cpu_has_native_bf16
from vitkit.serve.engines import TorchEngine
from vitkit.timing import alternate
from vitkit.utils import write_json_atomic


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="B/16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"])
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<kind>/served_path.json)")
    args = ap.parse_args()
    out = args.out or str(kind_folder() / "served_path.json")
    line = machine_line()
    print(line)
    _, cfg = model_config(args.model)
    base = build_model(cfg)
    x = example_batch(cfg, args.batch)
    rows = []
    for dtype in args.dtype:
        prepared = prepare_inference(copy.deepcopy(base), dtype)
        engine = TorchEngine(copy.deepcopy(base), dtype)
        same_plan = prepared.model.kernel_plan == engine.model.kernel_plan
        logits_equal = torch.equal(torch.from_numpy(engine.run(x)[0]), prepared(x).float())
        timed = alternate({"prepared": lambda: prepared(x), "served": lambda: engine.run(x)}, warmup=2,
                          repeats=args.repeats)
        row = {"dtype": dtype, "batch": args.batch, "model": args.model, "same_plan": same_plan,
               "logits_identical": logits_equal, "cpu_wait": timed.cpu_wait,
               "prepared_img_s": args.batch / timed["prepared"].median,
               "served_img_s": args.batch / timed["served"].median,
               "served_over_prepared": timed.ratio("prepared", "served"),
               "spread": {k: round(v.spread, 4) for k, v in timed.items()},
               "kernel_plan": prepared.model.kernel_plan.as_dict()}
        rows.append(row)
        print(f"{args.model} {dtype} batch {args.batch}: prepare_inference {row['prepared_img_s']:.2f} img/s, "
              f"served {row['served_img_s']:.2f} img/s -> served/prepared {row['served_over_prepared']:.3f} "
              f"(median paired round); same plan {same_plan}, logits identical {logits_equal}")
    result = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "machine": line, "runs": rows}
    write_json_atomic(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
