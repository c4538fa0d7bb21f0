"""The HTTP service: a FastAPI app around one model, its engine and a dynamic batcher.

:func:`create_app` builds the app (for ``vitkit serve``, for tests, to mount in another ASGI app, and for
Ray Serve). The model is loaded when the app is built (a bad checkpoint fails at once); the engine is
chosen, and the model warmed up, on the inference thread once the server runs: ``/healthz`` answers at
once, ``/readyz`` and the API only when that is done.

Every client fault is a 4xx JSON body ``{"error": CODE, "detail": TEXT}`` and one log line; a fault of
the server is a 500 with the same shape (its traceback goes to the log, never to the client).
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hmac
import logging
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from fastapi import Query, Request  # module level: the routes' annotations are resolved here

from ..errors import ConfigError
from .batching import Batcher, Done, QueueFull
from .images import BadImage, Decoded, decode, overlay_png

log = logging.getLogger("vitkit.serve")
STATIC = Path(__file__).resolve().parent / "static"
API_PATHS = ("/v1/classify", "/v1/embed", "/v1/explain", "/v1/model", "/metrics")
PUBLIC_PATHS = ("/", "/healthz", "/readyz", "/openapi.json", "/docs", "/favicon.ico")


@dataclass
class ServeOptions:
    """How the service runs: engine, batching, limits. Every field has a ``vitkit serve`` flag."""

    engine: str = "auto"  # auto | torch | onnxruntime | openvino
    dtype: str = "fp32"  # fp32 | bf16 | int8
    max_batch: int = 16  # images per batch
    max_wait_ms: float = 5.0  # how long the oldest waiting image may wait for others to join its batch
    max_queue: int = 256  # images waiting for a batch; past it: 503 with Retry-After
    max_bytes: int = 20 * 1024 * 1024  # one request's body
    max_pixels: int = 50_000_000  # one image (width x height, from its header)
    max_images: int = 32  # images in one request
    max_topk: int = 100
    read_timeout_s: float = 10.0  # the longest pause while an upload arrives (then 408)
    body_timeout_s: float = 60.0  # the longest an upload may take in all (then 408)
    token: Optional[str] = field(default=None, repr=False)  # bearer token for /v1/* and /metrics
    model_id: Optional[str] = None  # the name reported (default: the checkpoint's)
    preset: Optional[str] = None  # preprocessing preset (default: the checkpoint's own)
    engine_budget_s: float = 2.0  # seconds to time each engine at start-up
    decode_threads: int = 2
    watch_disconnect: bool = True  # drop the images of a request whose client has gone

    def check(self) -> "ServeOptions":
        from .engines import DTYPES, ENGINES

        if self.engine not in ("auto", *ENGINES):
            raise ConfigError(f"unknown engine {self.engine!r}: use auto, {', '.join(ENGINES)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}: use {', '.join(DTYPES)}")
        for name in ("max_batch", "max_queue", "max_bytes", "max_pixels", "max_images", "max_topk", "decode_threads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_wait_ms", "read_timeout_s", "body_timeout_s", "engine_budget_s"):
            if float(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.token is not None and not self.token.strip():
            raise ConfigError("the token is empty")
        return self

    def public(self) -> Dict[str, Any]:
        d = asdict(self)
        d.pop("token")
        d["token_required"] = self.token is not None
        return d


class Fault(Exception):
    """A request the server refuses: ``status`` (4xx, or 5xx for the server's own state), ``error`` (a stable
    code), ``detail`` (a sentence naming the problem); ``close``: drop the connection after the answer (the
    rest of an upload is not read)."""

    def __init__(self, status: int, error: str, detail: str, headers: Optional[Dict[str, str]] = None,
                 close: bool = False):
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail
        self.headers = dict(headers or {})
        if close:
            self.headers["Connection"] = "close"


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _safe_name(name: Optional[str], i: int) -> str:
    """A file name fit to echo: control characters dropped, undecodable bytes shown as U+FFFD, 200 chars."""
    if not name:
        return f"image {i + 1}"
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if isinstance(name, str) else str(name)
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C")
    return (text or f"image {i + 1}")[:200]


def _json_error(status: int, error: str, detail: str, headers: Optional[Dict[str, str]] = None):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can live in one process)."""

    def __init__(self, service: "Service"):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter("vitkit_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.latency = Histogram("vitkit_request_seconds", "Request latency (seconds) by endpoint", ["endpoint"],
                                 buckets=(.002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30), registry=r)
        self.batch_size = Histogram("vitkit_batch_size", "Images per inference batch",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.batch_seconds = Histogram("vitkit_batch_seconds", "Compute time of one batch (seconds)",
                                       buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)
        self.faults = Counter("vitkit_client_faults", "Refused requests by error code", ["error"], registry=r)
        depth = Gauge("vitkit_queue_depth", "Images waiting for a batch", registry=r)
        depth.set_function(lambda: service.batcher.pending if service.batcher is not None else 0)
        dropped = Gauge("vitkit_dropped_images", "Images dropped because their client had gone", registry=r)
        dropped.set_function(lambda: service.batcher.dropped if service.batcher is not None else 0)
        ready = Gauge("vitkit_ready", "1 once the model is loaded and warmed up", registry=r)
        ready.set_function(lambda: 1.0 if service.ready else 0.0)

    def render(self) -> Tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Service:
    """One model behind a batcher: decoding, inference and the answers, independent of HTTP."""

    def __init__(self, model, options: Optional[ServeOptions] = None,
                 batcher_factory: Optional[Callable[["Service"], Any]] = None):
        from ..predict import create_transform

        self.options = (options or ServeOptions()).check()
        self.model = model.eval().requires_grad_(False)
        self.config = model.config
        self.meta = model.meta
        self.pre = create_transform(model, self.options.preset)
        if self.config.in_chans not in (1, 3):
            raise ConfigError(f"images have 3 (RGB) or 1 (gray) channels; the model takes {self.config.in_chans}")
        self.gray = self.config.in_chans == 1
        self.labels = list(self.meta.labels) if self.meta.labels else None
        self.has_classifier = self.config.num_classes > 0
        self.model_id = self.options.model_id or self.config.name or Path(str(self.meta.source or "model")).name
        self.engine = None
        self.engine_report: Dict[str, Any] = {}
        self.ready = False
        self.failed: Optional[str] = None
        self.batcher = None
        self._batcher_factory = batcher_factory
        self.decoder = concurrent.futures.ThreadPoolExecutor(self.options.decode_threads,
                                                             thread_name_prefix="vitkit-decode")
        self.metrics = Metrics(self)
        self.on_failure: Optional[Callable[[str], None]] = None

    # --- life cycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the batcher and, on the inference thread, choose the engine and warm it up."""
        o = self.options
        if self._batcher_factory is not None:
            self.batcher = self._batcher_factory(self)
        else:
            self.batcher = Batcher(self.step, max_batch=o.max_batch, max_wait_ms=o.max_wait_ms,
                                   max_queue=o.max_queue, on_batch=self._on_batch)
        self.batcher.start()
        try:
            await self.batcher.call(self.prepare)
        except Exception as err:  # noqa: BLE001 - reported by /readyz and the log, and stops the server
            self.failed = f"{type(err).__name__}: {err}"
            log.error("the model could not be made ready: %s", self.failed)
            if self.on_failure is not None:
                self.on_failure(self.failed)
            return
        self.ready = True
        log.info("ready: %s on %s (%s), batches of up to %d within %g ms", self.model_id, self.engine.name,
                 self.engine.dtype, o.max_batch, o.max_wait_ms)

    def prepare(self) -> None:
        """Choose (or build) the engine and warm it up: runs on the inference thread."""
        from .engines import choose_engine, kernel_choices

        o = self.options
        t0 = time.perf_counter()
        budget = o.engine_budget_s if o.engine == "auto" else 0.0
        self.engine, self.engine_report = choose_engine(self.model, o.engine, o.dtype, o.max_batch, budget)
        self.step([("classify", self._blank())])  # warm-up: batch 1, the path a lone request takes
        self.engine_report["ready_s"] = round(time.perf_counter() - t0, 3)
        self.kernels = kernel_choices(self.engine)
        log.info("engine %s (%s); kernels: %s", self.engine.name, self.engine.dtype, self.kernels)

    def _blank(self) -> Decoded:
        h, w = self.config.img_size
        x = torch.zeros(self.config.in_chans, h, w)
        return Decoded("warm-up", x, torch.zeros(3, h, w), "-", w, h, "")

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()
        self.decoder.shutdown(wait=False)
        if self.engine is not None:
            self.engine.close()

    def _on_batch(self, info) -> None:
        self.metrics.batch_size.observe(info.size)
        self.metrics.batch_seconds.observe(info.compute_s)

    # --- inference (the inference thread) -----------------------------------------------------------------
    def step(self, items: List[Tuple[str, Decoded]]) -> List[Dict[str, Any]]:
        """One batch: the engine's logits and features for every image, the rollout for the explain ones."""
        x = torch.stack([d.x for _, d in items])
        logits, feats = self.engine.run(x)
        out = [{"logits": logits[i], "features": feats[i]} for i in range(len(items))]
        explain = [i for i, (kind, _) in enumerate(items) if kind == "explain"]
        if explain:
            from ..analysis.rollout import normalize_maps, rollout_maps

            dtype = next(self.model.parameters()).dtype
            maps = normalize_maps(rollout_maps(self.model, x[explain].to(dtype)).float())
            for j, i in enumerate(explain):
                out[i]["overlay"] = overlay_png(items[i][1].crop, maps[j])
        return out

    # --- requests (the event loop) ------------------------------------------------------------------------
    def check_ready(self) -> None:
        if self.failed:
            raise Fault(503, "not_ready", f"the model could not be made ready: {self.failed}")
        if not self.ready:
            raise Fault(503, "not_ready", "the model is still loading or warming up", {"Retry-After": "1"})

    def check_topk(self, topk: int) -> int:
        if not 1 <= topk <= self.options.max_topk:
            raise Fault(400, "bad_topk", f"topk must be between 1 and {self.options.max_topk} (--max-topk), "
                        f"got {topk}")
        return min(topk, max(self.config.num_classes, 1))

    def check_classifier(self, endpoint: str) -> None:
        if not self.has_classifier:
            raise Fault(409, "no_classifier", f"{self.model_id} has no classifier (num_classes=0: a feature "
                        f"extractor); {endpoint} needs one: use /v1/embed for its features")

    async def decode_all(self, uploads: Sequence[Tuple[str, bytes]]) -> List[Decoded]:
        """Decode and check every upload (on the decode threads); the first bad one refuses the request."""
        loop = asyncio.get_running_loop()
        o = self.options
        jobs = [loop.run_in_executor(self.decoder, lambda d=data, n=name: decode(d, self.pre, name=n,
                                                                                  max_pixels=o.max_pixels,
                                                                                  gray=self.gray))
                for name, data in uploads]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BadImage):
                which = f"image {i + 1} of {len(uploads)}: " if len(uploads) > 1 else ""
                raise Fault(r.status, r.error, which + r.detail)
            if isinstance(r, BaseException):
                raise r
        return list(results)

    async def infer(self, kind: str, decoded: List[Decoded], watch: Optional[Callable[[], Any]] = None) -> List[Done]:
        """Queue the images and wait for their results; ``watch``: an awaitable factory that returns when the
        client has gone (the images are then dropped from their batch, :class:`ClientGone` raised)."""
        try:
            futures = self.batcher.submit([(kind, d) for d in decoded])
        except QueueFull as err:
            raise Fault(503, "busy", str(err), {"Retry-After": str(err.retry_after)}) from None
        gathered = asyncio.gather(*futures)
        if watch is None:
            return await gathered
        gone = asyncio.ensure_future(watch())
        try:
            done, _ = await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            gathered.cancel()
            raise
        finally:
            gone.cancel()
        if gathered in done:
            return gathered.result()
        gathered.cancel()  # cancels every image's future: the batcher drops them
        raise ClientGone()

    def answer(self, kind: str, decoded: List[Decoded], done: List[Done], k: int, t_start: float,
               decode_s: float) -> Dict[str, Any]:
        from ..predict import top_classes

        results = []
        for d, r in zip(decoded, done):
            row: Dict[str, Any] = {"file": d.name, "width": d.width, "height": d.height, "format": d.format,
                                   "geometry": d.geometry, "batch": {"id": r.batch.id, "size": r.batch.size}}
            if kind in ("classify", "explain") and self.has_classifier:
                top = top_classes(torch.from_numpy(np.asarray(r.output["logits"]))[None], k, self.labels)[0]
                if top is None:
                    raise Fault(500, "not_finite", "the model's output is not finite (NaN or Inf): its weights hold "
                                "non-finite values or overflow")
                row["top"] = top
            if kind == "explain":
                row["top"] = row.get("top")
                row["overlay_png"] = base64.b64encode(r.output["overlay"]).decode("ascii")
            if kind == "embed":
                feats = np.asarray(r.output["features"], dtype=np.float32)
                row["dim"] = int(feats.shape[-1])
                row["embedding"] = [round(float(v), 6) for v in feats.tolist()]
            results.append(row)
        queue = max((r.queue_s for r in done), default=0.0)
        compute = sum({r.batch.id: r.batch.compute_s for r in done}.values())
        return {"model": self.model_id, "engine": self.engine.name, "dtype": self.engine.dtype, "results": results,
                "timing_ms": {"decode": round(decode_s * 1e3, 3), "queue": round(queue * 1e3, 3),
                              "compute": round(compute * 1e3, 3),
                              "total": round((time.perf_counter() - t_start) * 1e3, 3)}}

    def model_info(self) -> Dict[str, Any]:
        from .. import __version__

        cfg = self.config
        return {"id": self.model_id, "name": cfg.name, "format": self.meta.format, "source": self.meta.source,
                "notes": list(self.meta.notes), "num_classes": cfg.num_classes,
                "has_classifier": self.has_classifier, "labels": self.labels,
                "input": {"height": cfg.img_size[0], "width": cfg.img_size[1], "channels": cfg.in_chans},
                "preprocessing": self.pre.to_dict(), "config": cfg.to_dict(),
                "engine": self.engine.info() if self.engine is not None else None,
                "dtype": self.options.dtype, "engine_selection": self.engine_report,
                "kernels": getattr(self, "kernels", None), "ready": self.ready,
                "options": self.options.public(), "vitkit": __version__}


# --- reading a request ----------------------------------------------------------------------------------
async def read_body(request, limit: int, read_timeout: float, body_timeout: float) -> bytes:
    """The body, at most ``limit`` bytes: a declared Content-Length past it is refused before a byte is read;
    a body that grows past it is refused as soon as it does (the rest is never read). 408 when the upload
    pauses longer than ``read_timeout`` or takes longer than ``body_timeout`` in all."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise Fault(400, "bad_content_length", f"Content-Length {declared[:40]!r} is not a number",
                        close=True) from None
        if n > limit:
            raise Fault(413, "too_large", f"the upload is {n:,} bytes; the limit is {limit:,} (--max-bytes)",
                        close=True)
    buf = bytearray()
    start = time.perf_counter()
    chunks = request.stream().__aiter__()
    while True:
        left = body_timeout - (time.perf_counter() - start)
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(0.0, min(read_timeout, left)))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            what = (f"no data for {read_timeout:g} s" if left > read_timeout else
                    f"not complete after {body_timeout:g} s")
            raise Fault(408, "upload_timeout", f"the upload stalled: {what} ({len(buf):,} bytes received)",
                        close=True) from None
        except ClientDisconnect:
            raise ClientGone() from None
        buf += chunk
        if len(buf) > limit:
            raise Fault(413, "too_large", f"the upload is larger than the limit of {limit:,} bytes (--max-bytes)",
                        close=True)
    return bytes(buf)


async def read_uploads(request, options: ServeOptions) -> List[Tuple[str, bytes]]:
    """The images of a request: the raw body (``image/*`` or ``application/octet-stream``) or the ``file``
    fields of a ``multipart/form-data`` body."""
    ctype = request.headers.get("content-type", "")
    main = ctype.split(";")[0].strip().lower()
    if not (main.startswith("image/") or main in ("application/octet-stream", "multipart/form-data")):
        raise Fault(415, "unsupported_content_type",
                    f"Content-Type {ctype[:80]!r}: send one image as the body (Content-Type image/... or "
                    f"application/octet-stream) or multipart/form-data with a 'file' field per image")
    body = await read_body(request, options.max_bytes, options.read_timeout_s, options.body_timeout_s)
    if main != "multipart/form-data":
        if not body:
            raise Fault(400, "empty_body", "the request has no body: send an image")
        return [("body", body)]
    if not body:
        raise Fault(400, "empty_body", "the multipart body is empty: send a 'file' field per image")
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    request._body = body  # the form parser reads the body we already hold
    try:
        form = await request.form(max_files=options.max_images, max_fields=options.max_images + 16)
    except (HTTPException, MultiPartException) as err:
        detail = getattr(err, "detail", None) or getattr(err, "message", None) or str(err)
        if "Too many files" in detail or "Too many fields" in detail:
            raise Fault(413, "too_many_images", f"more than {options.max_images} images (or fields) in one "
                        f"request (--max-images)") from None
        raise Fault(400, "bad_multipart", f"the multipart body could not be parsed: {detail}") from None
    except (ValueError, KeyError, UnicodeError) as err:
        raise Fault(400, "bad_multipart", f"the multipart body could not be parsed: {err}") from None
    try:
        files = [v for k, v in form.multi_items() if k == "file"]
        if not files:
            names = sorted({k for k, _ in form.multi_items()})
            raise Fault(400, "no_file", "the multipart body has no 'file' field" +
                        (f" (fields: {', '.join(repr(n[:40]) for n in names[:10])})" if names else ""))
        uploads = []
        for i, f in enumerate(files):
            if isinstance(f, str):
                raise Fault(400, "bad_multipart", f"field 'file' number {i + 1} is text, not a file upload")
            uploads.append((_safe_name(f.filename, i), await f.read()))
        return uploads
    finally:
        await form.close()


async def _wait_disconnect(request) -> None:
    """Returns when the client has gone (the body has been read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# --- the app ----------------------------------------------------------------------------------------------
_IMAGE_BODY = {
    "required": True,
    "content": {
        "image/*": {"schema": {"type": "string", "format": "binary"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "array", "items": {"type": "string", "format": "binary"},
                     "description": "one field per image"}}}},
    },
}
_ERROR = {"description": "a client fault", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error", "detail"],
    "properties": {"error": {"type": "string"}, "detail": {"type": "string"}}}}}}
_FAULTS = {str(code): dict(_ERROR, description=text) for code, text in (
    (400, "empty body, bad multipart, bad topk"), (401, "missing or wrong token"),
    (408, "the upload stalled"), (409, "the model has no classifier"), (413, "too many bytes, pixels or images"),
    (415, "not an image / unsupported Content-Type"), (422, "an image that cannot be decoded"),
    (503, "not ready, or busy (Retry-After)"))}
_TOP = {"type": "array", "items": {"type": "object", "properties": {
    "rank": {"type": "integer"}, "index": {"type": "integer"}, "label": {"type": "string"},
    "prob": {"type": "number"}}}}


def _result_schema(extra: Dict[str, Any]) -> Dict[str, Any]:
    row = {"file": {"type": "string"}, "width": {"type": "integer"}, "height": {"type": "integer"},
           "format": {"type": "string"}, "geometry": {"type": "string"},
           "batch": {"type": "object", "properties": {"id": {"type": "integer"}, "size": {"type": "integer"}}},
           **extra}
    return {"description": "one result per image, in the order sent", "content": {"application/json": {"schema": {
        "type": "object", "properties": {
            "model": {"type": "string"}, "engine": {"type": "string"}, "dtype": {"type": "string"},
            "results": {"type": "array", "items": {"type": "object", "properties": row}},
            "timing_ms": {"type": "object", "properties": {k: {"type": "number"} for k in
                                                           ("decode", "queue", "compute", "total")}}}}}}}


class Guard:
    """ASGI middleware: the bearer token (constant-time compare) on /v1/* and /metrics, and the request
    metrics (by endpoint and status)."""

    def __init__(self, app, service: Service):
        self.app, self.service = app, service
        token = service.options.token
        self.token = token.encode("utf-8") if token else None

    def _needs_token(self, path: str) -> bool:
        return self.token is not None and (path.startswith("/v1/") or path == "/metrics")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in API_PATHS or path in ("/healthz", "/readyz") else "other"
        status = {"code": 500}
        t0 = time.perf_counter()

        async def send_status(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if self._needs_token(path):
                fault = self._check_token(scope)
                if fault is not None:
                    log.warning("%s %s -> %d %s: %s", scope.get("method"), path[:200], fault.status, fault.error,
                                fault.detail)
                    self.service.metrics.faults.labels(fault.error).inc()
                    resp = _json_error(fault.status, fault.error, fault.detail, fault.headers)
                    return await resp(scope, receive, send_status)
            await self.app(scope, receive, send_status)
        finally:
            m = self.service.metrics
            m.requests.labels(endpoint, str(status["code"])).inc()
            m.latency.labels(endpoint).observe(time.perf_counter() - t0)

    def _check_token(self, scope) -> Optional[Fault]:
        auth = b""
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                auth = v
                break
        hdr = {"WWW-Authenticate": 'Bearer realm="vitkit"'}
        if not auth:
            return Fault(401, "unauthorized", "this server needs a token: send 'Authorization: Bearer TOKEN'", hdr)
        scheme, _, given = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            return Fault(401, "unauthorized", "the Authorization header must be 'Bearer TOKEN'", hdr)
        if not hmac.compare_digest(given.strip(), self.token):
            return Fault(401, "unauthorized", "the token is wrong", hdr)
        return None


def build_app(service: Service, *, on_failure: Optional[Callable[[str], None]] = None):
    """The FastAPI app of ``service`` (routes, error handlers, the page, the lifespan that starts it)."""
    import contextlib

    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from .. import __version__

    if on_failure is not None:
        service.on_failure = on_failure

    @contextlib.asynccontextmanager
    async def lifespan(app):
        starting = asyncio.get_running_loop().create_task(service.start())
        app.state.starting = starting
        try:
            yield
        finally:
            if not starting.done():
                starting.cancel()
            await service.stop()

    app = FastAPI(title="vitkit serve", version=__version__, lifespan=lifespan,
                  description="A Vision Transformer as an HTTP service: classify, embed and explain images "
                  "(vitkit). Every client fault is a 4xx JSON body {error, detail}.", docs_url="/docs",
                  redoc_url=None)
    app.state.service = service

    def fault_response(request: Request, fault: Fault):
        (log.warning if fault.status < 500 else log.info)("%s %s -> %d %s: %s", request.method,
                                                          request.url.path[:200], fault.status, fault.error,
                                                          fault.detail)
        service.metrics.faults.labels(fault.error).inc()
        return _json_error(fault.status, fault.error, fault.detail, fault.headers)

    @app.exception_handler(Fault)
    async def _fault(request: Request, err: Fault):
        return fault_response(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException):
        codes = {404: ("not_found", f"no such path: {request.url.path[:200]} (see /docs)"),
                 405: ("method_not_allowed", f"{request.method} is not allowed on {request.url.path[:200]}")}
        error, detail = codes.get(err.status_code, ("bad_request", str(err.detail)))
        return fault_response(request, Fault(err.status_code, error, detail, getattr(err, "headers", None)))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        parts = []
        for e in err.errors():
            where = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "body"))
            parts.append(f"{where}: {e.get('msg')}")
        return fault_response(request, Fault(400, "bad_parameter", "; ".join(parts) or "bad parameters"))

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path[:200])
        return _json_error(500, "internal", f"the server failed on this request ({type(err).__name__}); "
                           f"its log has the details")

    async def run(kind: str, request: Request, topk: int) -> Response:
        t0 = time.perf_counter()
        service.check_ready()
        if kind != "embed":
            if kind == "classify":
                service.check_classifier("/v1/classify")
            k = service.check_topk(topk)
        else:
            k = 0
        expect = getattr(service.batcher, "expect", None)
        if expect is not None:
            expect(1)
        try:
            try:
                uploads = await read_uploads(request, service.options)
                if len(uploads) > service.options.max_images:
                    raise Fault(413, "too_many_images", f"{len(uploads)} images in one request; the limit is "
                                f"{service.options.max_images} (--max-images)")
                t1 = time.perf_counter()
                decoded = await service.decode_all(uploads)
                decode_s = time.perf_counter() - t1
            finally:
                if expect is not None:
                    expect(-1)
            watch = (lambda: _wait_disconnect(request)) if service.options.watch_disconnect else None
            done = await service.infer(kind, decoded, watch)
        except ClientGone:
            log.info("%s %s: the client went away before its answer", request.method, request.url.path)
            return Response(status_code=499)
        return JSONResponse(service.answer(kind, decoded, done, k, t0, decode_s))

    topk_q = Query(5, description="how many classes per image (1 to --max-topk)")

    @app.post("/v1/classify", summary="Top-k classes of one or more images", openapi_extra={"requestBody": _IMAGE_BODY},
              responses={200: _result_schema({"top": _TOP}), **_FAULTS})
    async def classify(request: Request, topk: int = topk_q):
        return await run("classify", request, topk)

    @app.post("/v1/embed", summary="The pooled pre-logits features of one or more images",
              openapi_extra={"requestBody": _IMAGE_BODY},
              responses={200: _result_schema({"dim": {"type": "integer"},
                                              "embedding": {"type": "array", "items": {"type": "number"}}}),
                         **_FAULTS})
    async def embed(request: Request):
        return await run("embed", request, 0)

    @app.post("/v1/explain", summary="Top-k classes plus the attention-rollout overlay (PNG, base64)",
              openapi_extra={"requestBody": _IMAGE_BODY},
              responses={200: _result_schema({"top": _TOP, "overlay_png": {"type": "string", "format": "byte"}}),
                         **_FAULTS})
    async def explain(request: Request, topk: int = topk_q):
        return await run("explain", request, topk)

    @app.get("/v1/model", summary="The model: labels, preprocessing, origin, config, engine, dtype, kernels")
    async def model_info():
        return service.model_info()

    @app.get("/healthz", summary="Alive (the process answers)")
    async def healthz():
        return {"status": "alive"}

    @app.get("/readyz", summary="200 once the model is loaded and warmed up, else 503",
             responses={503: _FAULTS["503"]})
    async def readyz():
        service.check_ready()
        return {"status": "ready", "model": service.model_id, "engine": service.engine.name,
                "dtype": service.engine.dtype}

    @app.get("/metrics", summary="Prometheus metrics (text format)", response_class=Response)
    async def metrics():
        body, ctype = service.metrics.render()
        return Response(body, media_type=ctype)

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                            headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return _wrap(app, service)


def _wrap(app, service: Service):
    """The FastAPI app with :class:`Guard` outermost (as a Starlette middleware, so ``app.openapi()``,
    ``app.state`` and mounting keep working)."""
    app.add_middleware(Guard, service=service)
    return app


def load_model(weights, *, img_size: Optional[int] = None, offline: Optional[bool] = None, device: str = "cpu"):
    """A model from anything :func:`vitkit.load_weights` reads (or a model, as it is)."""
    if isinstance(weights, torch.nn.Module):
        return weights
    from ..checkpoints import load_weights

    kw = {"img_size": img_size} if img_size else {}
    return load_weights(weights, offline=offline, progress=False, **kw).to(device)


def create_app(weights, options: Optional[ServeOptions] = None, **kwargs: Any):
    """The ASGI (FastAPI) app serving ``weights``: a model, or anything :func:`vitkit.load_weights` reads
    (path in any format, known name, Hub id, URL). Options as a :class:`ServeOptions` or keyword arguments
    (``create_app("model/", engine="torch", max_batch=8, token="...")``)."""
    if options is None:
        options = ServeOptions(**kwargs)
    elif kwargs:
        options = ServeOptions(**{**asdict(options), **kwargs})
    return build_app(Service(load_model(weights), options))
