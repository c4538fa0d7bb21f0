"""The refusals of the service: a client fault (or the server's own state) as :class:`vitkit.errors.Fault`,
answered as the JSON body ``{"error": CODE, "detail": TEXT}`` (on the v2 endpoints: ``{"error": "CODE: TEXT"}``);
a client that went away as :class:`ClientGone`."""
from __future__ import annotations

from typing import Dict, Optional

from ..errors import Fault


class ClientGone(Exception):
    """The client disconnected before its answer was ready: control flow inside the service (the request is
    dropped from its batch), never shown to anyone, so not a :class:`vitkit.errors.VitkitError`."""


def json_error(status: int, error: str, detail: str, headers: Optional[Dict[str, str]] = None, path: str = ""):
    """The JSON body ``{"error": CODE, "detail": TEXT}`` of a refusal (or of a fault of the server); under
    ``/v2/`` the Open Inference Protocol's ``{"error": "CODE: TEXT"}``."""
    from fastapi.responses import JSONResponse

    body = {"error": f"{error}: {detail}"} if is_v2(path) else {"error": error, "detail": detail}
    return JSONResponse(body, status_code=status, headers=headers)


def is_v2(path: str) -> bool:
    """A path of the Open Inference Protocol (v2) endpoints."""
    return path == "/v2" or path.startswith("/v2/")


__all__ = ["ClientGone", "Fault", "is_v2", "json_error"]
