"""Checkpoint commands: ``convert``, ``predict``, ``export``, ``weights``."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, NotFoundError, UsageError, require
from ._util import ManyFiles, positive_int


def _weights_args(p) -> None:
    """The options every command that reads weights by name shares."""
    p.add_argument("--weights-file", help="the local file for a known checkpoint name")
    p.add_argument("--offline", action="store_true", default=None,
                   help="use only files already on this machine (as HF_HUB_OFFLINE=1 does)")
    p.add_argument("--check-hash", action="store_true",
                   help="check a cached known file against its published SHA-256 (downloads are always checked)")


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert weights between vitkit, npz, torchvision, timm and hf layouts",
                       description="Read SRC in any supported format (recognised from its contents) and write it "
                       "in the format --to. Tensors are copied exactly: converting A -> B -> A gives A's tensors.")
    p.add_argument("src", help="weights file or folder (any format), a known checkpoint name, Hub id or URL")
    p.add_argument("dst", help="output file (npz, torchvision, timm) or folder (vitkit, hf; timm when DST is not a "
                   ".pth / .bin / .safetensors name: timm's Hub folder)")
    p.add_argument("--to", required=True, choices=["vitkit", "npz", "torchvision", "timm", "hf", "open_clip"])
    p.add_argument("--safetensors", action="store_true",
                   help="torchvision/timm: write safetensors, not a pickle (implied by a .safetensors DST)")
    p.add_argument("--force", "--overwrite", action="store_true", help="replace DST if it exists")
    p.add_argument("--flavour", choices=["vit_jax", "big_vision"], help="npz layout (default: as read, else vit_jax)")
    p.add_argument("--prefix", help="npz: key prefix such as 'params/' (default: as read, else none)")
    p.add_argument("--num-heads", type=positive_int, help="heads, for torchvision/timm files of non-standard sizes")
    _weights_args(p)
    p.set_defaults(func=_convert)

    p = sub.add_parser("predict", help="classify images with a checkpoint (top-k labels and probabilities)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders (searched recursively)")
    p.add_argument("--weights", "-w",
                   help="checkpoint path (any format), known name (vitkit weights), Hub id or URL")
    p.add_argument("--url", help="send the images to a vitkit serve server at URL instead of loading a model "
                   "(its token from $VITKIT_SERVE_TOKEN)")
    _weights_args(p)
    p.add_argument("--topk", type=positive_int, default=5)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--preset", help="preprocessing preset (default: the checkpoint's own)")
    p.add_argument("--img-size", type=positive_int, help="run at this resolution (position embeddings resized)")
    p.add_argument("--save-crop", metavar="DIR", help="save the exact crop each image became, as PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object per image")
    p.add_argument("--csv", metavar="FILE", help="also write the results as CSV (path, rank, index, label, prob)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ... (default: cpu)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_predict)

    p = sub.add_parser("export", help="export a checkpoint to ONNX, torch.export or OpenVINO, checked against eager")
    p.add_argument("weights", help="checkpoint path (any format) or known name")
    p.add_argument("output", help="output: .onnx, .pt2, or OpenVINO's NAME.xml (+ NAME.bin) or a folder")
    p.add_argument("--to", "--format", dest="format", choices=["onnx", "torch", "openvino"],
                   help="default: from the output's suffix (.onnx, .xml: openvino, else torch). onnx needs the onnx "
                   "extra (pip install 'vitkit[onnx]'), openvino the openvino extra; torch needs nothing more")
    p.add_argument("--img-size", type=positive_int, help="export at this resolution")
    p.add_argument("--opset", type=positive_int, default=17)
    p.add_argument("--static-batch", action="store_true", help="fix the batch size instead of a dynamic axis")
    _weights_args(p)
    p.set_defaults(func=_export)

    p = sub.add_parser("weights", help="list known pretrained checkpoints and where to get them")
    p.add_argument("name", nargs="?", help="show one entry in full")
    p.add_argument("--json", action="store_true")
    p.add_argument("--download", action="store_true", help="fetch NAME (any name -w takes) into the cache now")
    p.set_defaults(func=_weights)

    p = sub.add_parser("push", help="upload weights to a Hugging Face Hub repository (timm's or transformers' folder)",
                       description="Write WEIGHTS (any format or name vitkit reads) as a timm or transformers folder "
                       "with a model card and upload it to REPO_ID in one commit (the repository is created if "
                       "needed; token from --token, HF_TOKEN or huggingface-cli login; endpoint HF_ENDPOINT).")
    p.add_argument("weights", help="checkpoint path (any format), known name, Hub id or URL")
    p.add_argument("repo_id", help="OWNER/NAME of the Hub repository")
    p.add_argument("--to", choices=["timm", "hf"], default="timm",
                   help="timm: model.safetensors + timm's config.json (default); "
                        "hf: transformers' save_pretrained files")
    p.add_argument("--private", action="store_true", help="create the repository private")
    p.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    p.add_argument("--revision", help="branch to commit to (default: main)")
    p.add_argument("--message", help="commit message")
    p.add_argument("--num-heads", type=positive_int, help="heads, for torchvision/timm files of non-standard sizes")
    p.add_argument("--license", help="the card's licence (a Hub licence id, e.g. apache-2.0; default: the source's "
                   "where vitkit knows it, else 'unknown')")
    p.add_argument("--dry-run", metavar="DIR", help="write the exact folder that would be uploaded (weights, "
                   "config, model card) to DIR and stop: no network, no token")
    p.set_defaults(func=_push)

    p = sub.add_parser("inspect", help="recognise a checkpoint's format and show its config, layout and notes "
                       "(a name is resolved and downloaded as for predict; every tensor is read and checked)")
    p.add_argument("weights")
    p.add_argument("--json", action="store_true")
    p.add_argument("--offline", action="store_true", default=None, help="use only files already on this machine")
    p.set_defaults(func=_inspect)


def _convert(args) -> int:
    from ..checkpoints import convert, resolve_weights
    from ..utils import staged_output

    where = resolve_weights(args.src, file=args.weights_file, offline=args.offline)
    src = where.path
    if args.check_hash and where.entry is not None and where.entry.sha256 and src.is_file():
        from ..checkpoints.download import check_sha256
        check_sha256(src, where.entry.sha256, str(src))
    dst = Path(args.dst)
    if (dst.exists() or dst.is_symlink()) and not args.force:  # before staging: staging writes in place then
        raise InputError(f"{dst} already exists: choose another name, or pass --force to replace it")
    with staged_output(args.dst) as tmp:  # a failed conversion leaves no partial folder
        out = convert(src, tmp, args.to, num_heads=args.num_heads, safetensors=args.safetensors,
                      flavour=args.flavour, prefix=args.prefix, overwrite=args.force)
    print(f"wrote {args.dst if out == tmp else out} ({args.to})")
    return 0


def _push(args) -> int:
    from ..checkpoints import push_to_hub

    url = push_to_hub(args.weights, args.repo_id, to=args.to, private=args.private, token=args.token,
                      revision=args.revision, message=args.message, num_heads=args.num_heads, license=args.license,
                      dry_run=args.dry_run)
    if args.dry_run:
        files = sorted(p.name for p in Path(url).iterdir())
        print(f"wrote {url}: what 'vitkit push' would upload to {args.repo_id} ({args.to}): {', '.join(files)}; "
              f"nothing was uploaded")
        return 0
    print(f"pushed {args.weights} to {args.repo_id} ({args.to}): {url}")
    return 0


def _load(args, **kw):
    from ..checkpoints import load_weights
    return load_weights(args.weights, file=args.weights_file, offline=args.offline, check_hash=args.check_hash, **kw)


def _predict(args) -> int:
    import torch

    from ..predict import create_transform, iter_classify

    if bool(args.weights) == bool(args.url):
        raise UsageError("give --weights (classify here) or --url (send the images to a vitkit serve server)")
    many = ManyFiles("predict")
    files = many.images(args.images)
    if not files:
        return many.exit_code("images", "classified")
    if args.url:
        return _predict_remote(args, files, many)
    model = _load(args, img_size=args.img_size) if args.img_size else _load(args)
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        raise UsageError(f"--device {args.device!r} is not a device ({err}): use cpu, cuda, cuda:1, mps, ...") from None
    model = model.to(device)
    pre = create_transform(model, args.preset)
    if not args.json:
        where = f", from {model.meta.source}" if model.meta.source != args.weights else ""
        print(f"{args.weights} ({model.meta.format}{where}): input {pre.size[1]}x{pre.size[0]}; "
              f"preprocessing: {pre.describe()}")
    return _report_predictions(args, iter_classify(model, files, topk=args.topk, batch_size=args.batch_size,
                                                   preset=pre, save_crop=args.save_crop,
                                                   progress=not args.no_progress), many)


def _report_predictions(args, predictions, many) -> int:
    """Print each prediction as it comes (a table row or a JSON line), count it or report its image as
    skipped, write the CSV if asked; the exit code says whether some images failed."""
    from ..predict import format_json, format_table, write_csv

    preds = []
    for pred in predictions:
        preds.append(pred)
        if pred.ok:
            many.ok += 1
        else:
            many.skip(pred.source, pred.error)
        print(format_json(pred) if args.json else format_table(pred), flush=True)
    if args.csv:
        write_csv(preds, args.csv)
    return many.exit_code("images", "classified")


def _predict_remote(args, files, many) -> int:
    """``vitkit predict IMAGES --url URL``: each image is sent to the server; one it refuses is reported and
    skipped, as a file that cannot be read is here."""
    import os

    from ..predict import Prediction
    from ..serve.client import Client, ServeClientError

    client = Client(args.url, token=os.environ.get("VITKIT_SERVE_TOKEN") or None)
    info = client.model()
    if not args.json:
        print(f"{args.url}: {info.get('id')} on {(info.get('engine') or {}).get('name')} "
              f"({info.get('dtype')}); preprocessing: {(info.get('preprocessing') or {}).get('name')}")

    def remote():
        for path in files:
            pred = Prediction(str(path))
            try:
                row = client.classify([path], topk=args.topk)[0]
                pred.top, pred.geometry = row["top"], row.get("geometry")
            except ServeClientError as err:
                if err.status in (0, 401, 409, 503):  # the server, not this image: stop here
                    raise
                pred.error = err.detail
            yield pred

    return _report_predictions(args, remote(), many)


def _export(args) -> int:
    from ..export import export

    kw = {"dynamic_batch": not args.static_batch}
    fmt = args.format or {".onnx": "onnx", ".xml": "openvino"}.get(Path(args.output).suffix.lower(), "torch")
    if fmt == "onnx":
        require("onnx", "onnx", what="vitkit export to ONNX")  # before any work
    if fmt == "openvino":
        require("openvino", "onnx", "openvino", what="vitkit export to OpenVINO")
    if fmt in ("onnx", "openvino"):
        kw["opset"] = args.opset
    model = _load(args, img_size=args.img_size) if args.img_size else _load(args)
    report = export(model, args.output, fmt, **kw)
    print(json.dumps(report))
    return 0


def _weights(args) -> int:
    from ..checkpoints import get_known, list_known, resolve_weights

    if args.download:
        if not args.name:
            raise UsageError("--download needs a NAME: vitkit weights --download torchvision/vit_b_16")
        print(resolve_weights(args.name).path)
        return 0
    if args.name:
        entry = get_known(args.name)
        if entry is None:
            raise NotFoundError(f"unknown checkpoint {args.name!r}: run 'vitkit weights' for the list")
        print(json.dumps(entry.to_dict(), indent=2))
        return 0
    rows = list_known()
    if args.json:
        for e in rows:
            print(json.dumps(e.to_dict()))
        return 0
    w = max(len(e.model) for e in rows)
    print(f"{'name':48} {'model':{w}} {'px':>4} {'preset':16} {'labels':11} {'top-1':>6}  params")
    for e in rows:
        top1 = f"{e.top1:.2f}" if e.top1 is not None else "-"
        params = f"{e.params / 1e6:.1f}M" if e.params else f"{_computed_params(e) / 1e6:.1f}M*"
        print(f"{e.name:48} {e.model:{w}} {e.img_size:>4} {e.preset or '(its config)':16} {e.labels:11} {top1:>6}"
              f"  {params}")
    print("\n* computed from the architecture (not published with the file). Any command's -w NAME downloads the "
          "weights on first use\n  (or 'vitkit weights --download NAME'): URL files into TORCH_HOME/hub/checkpoints, "
          "Hub repositories into the Hugging Face cache.")
    return 0


def _computed_params(e) -> int:
    from ..config import config_from_name
    from ..models.cost import cost
    cfg = config_from_name(e.model, img_size=e.img_size, num_classes=e.num_classes,
                           representation_size=e.representation_size)
    return cost(cfg).params


def _inspect(args) -> int:
    from ..checkpoints import read_checkpoint, resolve_weights

    ck = read_checkpoint(resolve_weights(args.weights, offline=args.offline).path)
    info = {"format": ck.format, "layout": ck.layout, "config": ck.config.to_dict(),
            "labels": (ck.labels[:5] + ["..."]) if ck.labels and len(ck.labels) > 5 else ck.labels,
            "preprocessing": ck.preprocessing, "tensors": len(ck.state),
            "parameters": int(sum(t.numel() for t in ck.state.values())), "notes": ck.notes}
    if args.json:
        print(json.dumps(info))
    else:
        print(ck.describe())
        for k in ("layout", "preprocessing", "notes"):
            print(f"  {k}: {info[k]}")
        print(f"  tensors: {info['tensors']}, parameters: {info['parameters']:,}")
    return 0
