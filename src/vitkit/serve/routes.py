"""The app's routes: the fault handlers (every refusal as ``{error, detail}``; ``{error}`` under /v2), the
image endpoints, the model / health / metrics endpoints, the Open Inference Protocol (v2) endpoints, and the
page with its static files."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import Query, Request  # module level: the routes' annotations are resolved here
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from .faults import ClientGone, Fault, json_error
from .openapi import FAULTS, IMAGE_BODY, TOP, result_schema
from .uploads import read_uploads, read_v2_request, wait_disconnect

if TYPE_CHECKING:
    from .service import Service

log = logging.getLogger("vitkit.serve")
STATIC = Path(__file__).resolve().parent / "static"


def fault_response(service: "Service", request: Request, fault: Fault):
    """The answer to a refused request, with its log line and its count in the metrics."""
    say = log.warning if fault.status < 500 else log.info  # 503 not_ready / busy: the server's state
    say("%s %s -> %d %s: %s", request.method, request.url.path[:200], fault.status, fault.error, fault.detail)
    service.metrics.faults.labels(fault.error).inc()
    return json_error(fault.status, fault.error, fault.detail, fault.headers, request.url.path)


def add_fault_handlers(app, service: "Service") -> None:
    """Faults, unknown paths and methods, and bad parameters as 4xx ``{error, detail}``; anything else as a
    500 of the same shape (the traceback goes to the log, never to the client)."""

    @app.exception_handler(Fault)
    async def _fault(request: Request, err: Fault):
        return fault_response(service, request, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        codes = {404: ("not_found", f"no such path: {request.url.path[:200]} (see /openapi.json)"),
                 405: ("method_not_allowed", f"{request.method} is not allowed on {request.url.path[:200]}")}
        error, detail = codes.get(err.status_code, ("bad_request", str(err.detail)))
        return fault_response(service, request, Fault(err.status_code, error, detail, getattr(err, "headers", None)))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        parts = []
        for e in err.errors():
            where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "body"))
            parts.append(f"{where}: {e.get('msg')}")
        return fault_response(service, request, Fault(400, "bad_parameter", "; ".join(parts) or "bad parameters"))

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path[:200])
        return json_error(500, "internal", f"the server failed on this request ({type(err).__name__}); "
                          f"its log has the details", path=request.url.path)


async def handle(service: "Service", kind: str, request: Request, topk: int) -> Response:
    """One image request (``classify``, ``embed`` or ``explain``): the checks, the upload, decoding,
    inference and the answer; 499 when the client goes away first."""
    t0 = time.perf_counter()
    service.check_ready()
    if kind != "embed":
        if kind == "classify":
            service.check_classifier("/v1/classify")
        else:
            service.check_explain()
        k = service.check_topk(topk)
    else:
        k = 0

    async def read():
        uploads = await read_uploads(request, service.options)
        if len(uploads) > service.options.max_images:
            raise Fault(413, "too_many_images", f"{len(uploads)} images in one request; the limit is "
                        f"{service.options.max_images} (--max-images)")
        t1 = time.perf_counter()
        return None, await service.decode_all(uploads), time.perf_counter() - t1

    got = await run_images(service, kind, request, read)
    if got is None:
        return Response(status_code=499)
    _, decoded, done, decode_s = got
    return JSONResponse(service.answer(kind, decoded, done, k, t0, decode_s))


async def run_images(service: "Service", kind: str, request: Request, read):
    """The path every image request takes (/v1 and /v2): ``read()`` (the body within the limits, checked and
    decoded: ``(parsed, decoded, decode_s)``) while the batcher knows a request is on its way, then the images
    through the batcher; ``(parsed, decoded, done, decode_s)``, or None when the client went away first."""
    service.batcher.expect(1)
    try:
        try:
            parsed, decoded, decode_s = await read()
        finally:
            service.batcher.expect(-1)
        watch = (lambda: wait_disconnect(request)) if service.options.watch_disconnect else None
        done = await service.infer(kind, decoded, watch)
    except ClientGone:
        log.info("%s %s: the client went away before its answer", request.method, request.url.path)
        return None
    return parsed, decoded, done, decode_s


def add_image_routes(app, service: "Service") -> None:
    """POST /v1/classify, /v1/embed and /v1/explain."""
    topk_q = Query(5, description="how many classes per image (1 to --max-topk)")

    @app.post("/v1/classify", summary="Top-k classes of one or more images", openapi_extra={"requestBody": IMAGE_BODY},
              responses={200: result_schema({"top": TOP}), **FAULTS})
    async def classify(request: Request, topk: int = topk_q):
        return await handle(service, "classify", request, topk)

    @app.post("/v1/embed", summary="The pooled pre-logits features of one or more images",
              openapi_extra={"requestBody": IMAGE_BODY},
              responses={200: result_schema({"dim": {"type": "integer"},
                                             "embedding": {"type": "array", "items": {"type": "number"}}}),
                         **FAULTS})
    async def embed(request: Request):
        return await handle(service, "embed", request, 0)

    @app.post("/v1/explain", summary="Top-k classes plus the attention-rollout overlay (PNG, base64)",
              openapi_extra={"requestBody": IMAGE_BODY},
              responses={200: result_schema({"top": TOP, "overlay_png": {"type": "string", "format": "byte"}}),
                         **FAULTS})
    async def explain(request: Request, topk: int = topk_q):
        return await handle(service, "explain", request, topk)


def add_status_routes(app, service: "Service") -> None:
    """GET /v1/model, /healthz, /readyz and /metrics."""

    @app.get("/v1/model", summary="The model: labels, preprocessing, origin, config, engine, dtype, kernels")
    async def model_info():
        return service.model_info()

    @app.get("/healthz", summary="Alive (the process answers)")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz", summary="200 once the model is loaded and warmed up, else 503",
             responses={503: FAULTS["503"]})
    async def readyz():
        service.check_ready()
        return {"status": "ready", "model": service.model_id, "engine": service.engine.name,
                "dtype": service.engine.dtype}

    @app.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
    async def metrics():
        body, ctype = service.metrics.render()
        return Response(body, media_type=ctype)


def add_v2_routes(app, service: "Service") -> None:
    """The Open Inference Protocol (v2: KServe, Triton, MLServer): health, server and model metadata, model
    readiness and inference, on the same service, limits, token rule and batcher as /v1."""
    from .. import __version__

    def check_model(model_id: str) -> None:
        if model_id != service.model_id:
            raise Fault(404, "model_not_found", f"no model {model_id[:80]!r}: this server serves "
                        f"{service.model_id!r}")

    @app.get("/v2", summary="Server metadata (Open Inference Protocol)")
    async def server_metadata():
        return {"name": "vitkit", "version": __version__, "extensions": []}

    @app.get("/v2/health/live", summary="Alive (Open Inference Protocol)")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready", summary="Ready: 200 once the model is warmed up, else 503",
             responses={503: FAULTS["503"]})
    async def ready():
        service.check_ready()
        return {"ready": True}

    @app.get("/v2/models/{model_id:path}/ready", summary="The model is ready: 200, else 503")
    async def model_ready(model_id: str):
        check_model(model_id)
        service.check_ready()
        return {"name": service.model_id, "ready": True}

    @app.post("/v2/models/{model_id:path}/infer", summary="Inference: FP32 pixels [N, C, H, W] or BYTES images "
              "(base64) in, logits and probabilities (or features) out")
    async def infer(model_id: str, request: Request):
        check_model(model_id)
        service.check_ready()
        return await handle_v2(service, request)

    @app.get("/v2/models/{model_id:path}", summary="Model metadata: inputs and outputs with datatype and shape")
    async def model_metadata(model_id: str):
        check_model(model_id)
        return service.v2_metadata()


async def handle_v2(service: "Service", request: Request) -> Response:
    """One v2 infer request: the JSON body within the limits, its images decoded (BYTES) or its tensor taken
    as the model's input (FP32), then the same batcher as /v1."""
    c, h, w = service.config.in_chans, *service.config.img_size
    kind = "classify" if service.has_classifier else "embed"

    async def read():
        req = await read_v2_request(request, service.options, (c, h, w))
        service.check_v2_outputs(req.outputs)
        t1 = time.perf_counter()
        if req.pixels is not None:
            decoded = service.tensor_items(req.input_name, req.pixels)
        else:
            decoded = await service.decode_all(req.uploads)
        return req, decoded, time.perf_counter() - t1

    got = await run_images(service, kind, request, read)
    if got is None:
        return Response(status_code=499)
    req, _, done, _ = got
    return JSONResponse(service.answer_v2(req.id, req.outputs, done))


def add_page(app) -> None:
    """The web page at /, its icon and its static files (all served from this package, nothing from a CDN)."""

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
