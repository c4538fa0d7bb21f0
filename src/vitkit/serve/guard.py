"""The outermost layer of the app: the bearer token on /v1/*, /v2/models/* and /metrics, and the request
metrics."""
from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import TYPE_CHECKING, Optional

from .faults import Fault, json_error

if TYPE_CHECKING:
    from .service import Service

log = logging.getLogger("vitkit.serve")
API_PATHS = ("/v1/classify", "/v1/embed", "/v1/explain", "/v1/model", "/metrics")
OPEN_PATHS = ("/healthz", "/readyz", "/v2", "/v2/health/live", "/v2/health/ready")  # no token: probes


def endpoint_of(path: str) -> str:
    """The metrics label of a path: the API paths as they are, a v2 model path by what it asks, else 'other'
    (a label per unknown path would let a client grow the metrics without bound)."""
    if path in API_PATHS or path in OPEN_PATHS:
        return path
    if path.startswith("/v2/models/"):
        return "/v2/models/infer" if path.endswith("/infer") else "/v2/models/ready" if path.endswith(
            "/ready") else "/v2/models"
    return "other"


class Guard:
    """ASGI middleware: the bearer token (constant-time compare) on /v1/*, /v2/models/* and /metrics, and
    the request metrics (by endpoint and status)."""

    def __init__(self, app, service: "Service"):
        self.app, self.service = app, service
        token = service.options.token
        # compared as SHA-256 digests: equal lengths, so the constant-time compare leaks not even the length
        self.token = hashlib.sha256(token.encode("utf-8")).digest() if token else None

    def _needs_token(self, path: str) -> bool:
        return self.token is not None and (path.startswith(("/v1/", "/v2/models")) or path == "/metrics")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted inside another app: the path below the mount point
            path = path[len(root):] or "/"
        endpoint = endpoint_of(path)
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
                    resp = json_error(fault.status, fault.error, fault.detail, fault.headers, path)
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
        if not hmac.compare_digest(hashlib.sha256(given.strip()).digest(), self.token):
            return Fault(401, "unauthorized", "the token is wrong", hdr)
        return None
