"""The refusals of the service: a client fault (or the server's own state) as :class:`Fault`, answered as the
JSON body ``{"error": CODE, "detail": TEXT}`` (on the v2 endpoints: ``{"error": "CODE: TEXT"}``); a client that
went away as :class:`ClientGone`."""
from __future__ import annotations

from typing import Dict, Optional


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


def json_error(status: int, error: str, detail: str, headers: Optional[Dict[str, str]] = None, path: str = ""):
    """The JSON body ``{"error": CODE, "detail": TEXT}`` of a refusal (or of a fault of the server); under
    ``/v2/`` the Open Inference Protocol's ``{"error": "CODE: TEXT"}``."""
    from fastapi.responses import JSONResponse

    body = {"error": f"{error}: {detail}"} if is_v2(path) else {"error": error, "detail": detail}
    return JSONResponse(body, status_code=status, headers=headers)


def is_v2(path: str) -> bool:
    """A path of the Open Inference Protocol (v2) endpoints."""
    return path == "/v2" or path.startswith("/v2/")
