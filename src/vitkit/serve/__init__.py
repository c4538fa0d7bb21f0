"""``vitkit serve``: a ViT as an HTTP service (FastAPI on uvicorn), with dynamic batching, the fastest engine
on the machine, a web page, a client and a Ray Serve deployment. See docs/serving.md.

The server needs the ``serve`` extra (``pip install 'vitkit[serve]'``); :class:`Client` needs nothing
beyond the standard library.
"""
from __future__ import annotations

from typing import Any

from ..errors import MissingDependency
from .client import Client, ServeClientError

__all__ = ["Client", "ServeClientError", "ServeOptions", "Service", "create_app", "run"]


def __getattr__(name: str) -> Any:  # the server side imports FastAPI: only when asked for
    if name in ("ServeOptions", "Service", "create_app", "build_app"):
        try:
            from . import app
        except ImportError as err:
            raise MissingDependency(f"vitkit.serve.{name} needs the serve extra ({err})", extra="serve") from None
        return getattr(app, name)
    if name == "run":
        from .server import run
        return run
    raise AttributeError(f"module 'vitkit.serve' has no attribute {name!r}")
