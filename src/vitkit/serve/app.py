"""The HTTP service: a FastAPI app around one model, its engine and a dynamic batcher.

:func:`create_app` builds the app (for ``vitkit serve``, for tests, to mount in another ASGI app, and for
Ray Serve). The model is loaded when the app is built (a bad checkpoint fails at once); the engine is
chosen, and the model warmed up, on the inference thread once the server runs: ``/healthz`` answers at
once, ``/readyz`` and the API only when that is done.

Every client fault is a 4xx JSON body ``{"error": CODE, "detail": TEXT}`` (on the v2 endpoints the Open
Inference Protocol's ``{"error": "CODE: TEXT"}``) and one log line; a fault of the server is a 500 with the
same shape (its traceback goes to the log, never to the client).

The parts, one job each: :mod:`.options` (the settings), :mod:`.service` (the model, its engine, warm-up,
inference and answers), :mod:`.uploads` (reading a request within the limits), :mod:`.faults` (refusals),
:mod:`.routes` (the endpoints, /v1 and the Open Inference Protocol's /v2, and the page), :mod:`.openapi` (the
schema's extras), :mod:`.guard` (token and request metrics) and :mod:`.metrics` (Prometheus).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict
from typing import Any, Callable, Optional

import torch

from .guard import Guard
from .options import ServeOptions
from .routes import add_fault_handlers, add_image_routes, add_page, add_status_routes, add_v2_routes
from .service import Service

__all__ = ["ServeOptions", "Service", "build_app", "create_app", "load_model"]


def _lifespan(service: Service):
    """The app's lifespan: the service starts (engine choice and warm-up on the inference thread) while the
    server already answers /healthz, and stops when the server does."""

    @contextlib.asynccontextmanager
    async def run(app):
        starting = asyncio.get_running_loop().create_task(service.start())
        app.state.starting = starting
        try:
            yield
        finally:
            if not starting.done():
                starting.cancel()
            await service.stop()

    return run


def build_app(service: Service, *, on_failure: Optional[Callable[[str], None]] = None):
    """The FastAPI app of ``service`` (routes, error handlers, the page, the lifespan that starts it)."""
    import importlib.util

    from ..errors import MissingDependency

    if not (importlib.util.find_spec("python_multipart") or importlib.util.find_spec("multipart")):
        raise MissingDependency("vitkit serve reads multipart uploads with python-multipart, which is not "
                                "installed", extra="serve")

    from fastapi import FastAPI

    from .. import __version__

    if on_failure is not None:
        service.on_failure = on_failure
    app = FastAPI(title="vitkit serve", version=__version__, lifespan=_lifespan(service),
                  description="A Vision Transformer as an HTTP service: classify, embed and explain images "
                  "(vitkit). Every client fault is a 4xx JSON body {error, detail}.",
                  docs_url=None, redoc_url=None)  # their pages load scripts from a CDN: the schema is /openapi.json
    app.state.service = service
    add_fault_handlers(app, service)
    add_image_routes(app, service)
    add_status_routes(app, service)
    add_v2_routes(app, service)
    add_page(app)
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
    return build_app(Service(load_model(weights, device=options.device), options))
