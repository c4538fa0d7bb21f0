"""``vitkit serve``: a ViT as an HTTP service (FastAPI on uvicorn), with dynamic batching, the fastest engine
on the machine, a web page, a client and a Ray Serve deployment. See docs/serving.md.

The server needs the ``serve`` extra (``pip install 'vitkit[serve]'``); :class:`Client` needs nothing
beyond the standard library.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import Client, ServeClientError

if TYPE_CHECKING:  # the server side imports FastAPI: loaded on first use (__getattr__ below)
    from .app import ServeOptions, Service, create_app
    from .server import run

__all__ = ["Client", "ServeClientError", "ServeOptions", "Service", "create_app", "run"]


def __getattr__(name: str) -> Any:  # the server side imports FastAPI: only when asked for
    if name in ("ServeOptions", "Service", "create_app", "build_app"):
        from ..errors import require

        require("serve", "fastapi", "uvicorn", "prometheus_client", what=f"vitkit.serve.{name}")
        from . import app
        return getattr(app, name)
    if name == "run":
        from .server import run
        return run
    raise AttributeError(f"module 'vitkit.serve' has no attribute {name!r}")
