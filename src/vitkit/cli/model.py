"""Model commands: ``smoke``, ``info``, ``models``."""
from __future__ import annotations

import json

from ..config import PAPER_MODELS, config_from_name, list_models
from ..errors import UsageError
from ..models.cost import cost, format_cost, variant_fields
from ._util import parse_overrides, positive_int


def register(sub) -> None:
    p = sub.add_parser("smoke", help="run the paper's mechanics on a tiny ViT on CPU (a few seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_smoke)

    p = sub.add_parser("info", help="parameters, tokens, multiply-adds, FLOPs and memory of a model")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="model names such as B/16, vit_base_patch16_224, vit-b16 (default: the paper's models)")
    p.add_argument("--img-size", type=positive_int, nargs="+", metavar="N", help="input size: N or H W")
    p.add_argument("--batch", type=positive_int, default=1, help="batch size for the memory estimate")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set posemb=sincos2d --set num_classes=10")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    p.set_defaults(func=_info)

    p = sub.add_parser("models", help="list the known model names")
    p.set_defaults(func=lambda args: print("\n".join(list_models())))


def _smoke(args) -> int:
    from ..smoke import run_smoke

    run_smoke(seed=args.seed)
    return 0


def _info(args) -> int:
    overrides = parse_overrides(args.set)
    size = None
    if args.img_size:
        if len(args.img_size) > 2:
            raise UsageError("--img-size takes N or H W")
        size = tuple(args.img_size) if len(args.img_size) == 2 else args.img_size[0]
    names = args.models or list(PAPER_MODELS)
    for i, name in enumerate(names):
        cfg = config_from_name(name, **overrides)
        c = cost(cfg, size)
        if args.json:
            print(json.dumps({"model": cfg.name or name, **c.to_dict(), "variant": variant_fields(cfg)}))
        else:
            if i:
                print()
            print(format_cost(cfg.name or name, c, args.batch, cfg))
    return 0
