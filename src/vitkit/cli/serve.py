"""``vitkit serve``: a checkpoint as an HTTP service (see docs/serving.md)."""
from __future__ import annotations

from ._util import positive_int


def _positive_float(text: str) -> float:
    import argparse
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve a checkpoint over HTTP: classify, embed, explain, a web page",
                       description="Serve WEIGHTS (any checkpoint vitkit reads) with its own preprocessing and "
                       "labels: POST /v1/classify, /v1/embed, /v1/explain; GET /v1/model, /healthz, /readyz, "
                       "/metrics, /openapi.json, and a web page at /; the Open Inference Protocol (KServe, "
                       "Triton, MLServer): GET /v2/health/live, /v2/health/ready, /v2/models/ID, POST "
                       "/v2/models/ID/infer. Concurrent requests are batched dynamically. "
                       "Binds 127.0.0.1; any other address needs a token (--token-file or $VITKIT_SERVE_TOKEN) "
                       "or an explicit --insecure. SIGTERM drains: no new connections, every accepted request "
                       "is answered, exit 0. Needs the serve extra: pip install 'vitkit[serve]'.")
    p.add_argument("weights", metavar="WEIGHTS",
                   help="checkpoint path (any format), known name (vitkit weights), Hub id or URL")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--engine", default="auto", choices=["auto", "torch", "onnxruntime", "openvino"],
                   help="auto (default): time every installed engine on this model at --max-batch, check its "
                   "logits against eager PyTorch, serve the fastest")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "int8"])
    p.add_argument("--max-batch", type=positive_int, default=16, help="images per batch (default 16)")
    p.add_argument("--max-wait-ms", type=_positive_float, default=5.0,
                   help="how long an image may wait for others to join its batch (default 5)")
    p.add_argument("--max-queue", type=positive_int, default=256,
                   help="images waiting for a batch before requests get 503 + Retry-After (default 256)")
    p.add_argument("--token-file", metavar="PATH", help="bearer token clients must send (else $VITKIT_SERVE_TOKEN)")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --host without a token")
    p.add_argument("--max-bytes", type=positive_int, default=20 * 1024 * 1024,
                   help="largest request body in bytes (default 20 MiB; 413 past it)")
    p.add_argument("--max-pixels", type=positive_int, default=50_000_000,
                   help="largest image, width x height from its header (default 50 million; 413 past it)")
    p.add_argument("--max-images", type=positive_int, default=32, help="images in one request (default 32)")
    p.add_argument("--max-topk", type=positive_int, default=100, help="largest ?topk= (default 100)")
    p.add_argument("--read-timeout", type=_positive_float, default=10.0,
                   help="seconds an upload may pause before 408 (default 10)")
    p.add_argument("--body-timeout", type=_positive_float, default=60.0,
                   help="seconds an upload may take in all before 408 (default 60)")
    p.add_argument("--decode-threads", type=positive_int, default=2,
                   help="threads that decode and resize uploaded images (default 2)")
    p.add_argument("--no-watch-disconnect", dest="watch_disconnect", action="store_false",
                   help="keep the images of a request whose client has gone in their batch (default: drop them)")
    p.add_argument("--drain-timeout", type=_positive_float, default=30.0,
                   help="on SIGTERM, seconds to finish accepted requests (default 30)")
    p.add_argument("--engine-budget", type=_positive_float, default=2.0,
                   help="--engine auto: seconds to time each engine (default 2)")
    p.add_argument("--device", default="cpu",
                   help="where the model runs: cpu (default), cuda, cuda:1, mps (the torch engine only)")
    p.add_argument("--preset", help="preprocessing preset (default: the checkpoint's own)")
    p.add_argument("--img-size", type=positive_int, help="serve at this resolution (position embeddings resized)")
    p.add_argument("--model-id", help="the model name reported (default: the checkpoint's)")
    p.add_argument("--offline", action="store_true", default=None, help="use only files already on this machine")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="also log every request (uvicorn's access log)")
    p.add_argument("--ray", action="store_true", help="run as a Ray Serve deployment (pip install 'ray[serve]')")
    p.add_argument("--replicas", type=positive_int, default=1, help="--ray: number of replicas (default 1)")
    p.add_argument("--replica-cpus", type=positive_int,
                   help="--ray: CPUs per replica, also its thread count (default: this machine's cores / replicas)")
    p.add_argument("--ray-address", help="--ray: a running Ray cluster (default: start a local one, or $RAY_ADDRESS)")
    p.set_defaults(func=_serve)


# each ServeOptions field and the flag (argparse dest) that sets it; the token is read from --token-file (or
# $VITKIT_SERVE_TOKEN) by the server, never taken from the command line, where other users could see it
OPTION_FLAGS = {"engine": "engine", "dtype": "dtype", "max_batch": "max_batch", "max_wait_ms": "max_wait_ms",
                "max_queue": "max_queue", "max_bytes": "max_bytes", "max_pixels": "max_pixels",
                "max_images": "max_images", "max_topk": "max_topk", "read_timeout_s": "read_timeout",
                "body_timeout_s": "body_timeout", "token": "token_file", "model_id": "model_id", "preset": "preset",
                "engine_budget_s": "engine_budget", "device": "device", "decode_threads": "decode_threads",
                "watch_disconnect": "watch_disconnect"}


def options_from_args(args):
    """The :class:`~vitkit.serve.options.ServeOptions` the flags give (the token comes later, from its file)."""
    from ..serve.options import ServeOptions

    return ServeOptions(**{f: getattr(args, dest) for f, dest in OPTION_FLAGS.items() if f != "token"})


# an engine asked for by name: the extra that installs it and what it imports (auto times those installed)
ENGINE_EXTRAS = {"onnxruntime": ("onnx", "onnx", "onnxruntime"), "openvino": ("openvino", "onnx", "openvino")}


def _serve(args) -> int:
    from ..errors import require

    # every package the options ask for, before the model is loaded or a port bound
    require("serve", "fastapi", "uvicorn", "prometheus_client", what="vitkit serve")
    if args.engine in ENGINE_EXTRAS:
        extra, *modules = ENGINE_EXTRAS[args.engine]
        require(extra, *modules, what=f"vitkit serve --engine {args.engine}")
    if args.ray:
        from ..serve.ray import require_ray_serve

        require_ray_serve()
    options = options_from_args(args)
    if args.ray:
        from ..serve.ray import run_ray

        return run_ray(args.weights, host=args.host, port=args.port, options=options, token_file=args.token_file,
                       insecure=args.insecure, replicas=args.replicas, address=args.ray_address,
                       img_size=args.img_size, offline=args.offline, replica_cpus=args.replica_cpus)
    from ..serve.server import run

    return run(args.weights, host=args.host, port=args.port, options=options, token_file=args.token_file,
               insecure=args.insecure, img_size=args.img_size, offline=args.offline, log_level=args.log_level,
               access_log=args.access_log, drain_timeout_s=args.drain_timeout)
