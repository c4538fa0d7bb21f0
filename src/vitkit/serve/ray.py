"""``vitkit serve WEIGHTS --ray``: the same app as a Ray Serve deployment (replicas, autoscaling, a cluster).

Each replica loads the model, builds the same FastAPI app (:func:`vitkit.serve.app.build_app`) and answers
through Ray Serve's HTTP proxy; the batching is Ray Serve's own (``@serve.batch``, set to ``--max-batch`` and
``--max-wait-ms``), the batch running on the replica's one inference thread. Everything else (decoding and
checks, limits, tokens, errors, metrics per replica, the page) is the app's. See docs/serving.md for a
multi-node cluster.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import os
import signal
import threading
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional

from .batching import BatchInfo, Done, QueueFull
from .options import ServeOptions

log = logging.getLogger("vitkit.serve")


def ray_serve_installed() -> bool:
    """Whether Ray Serve is installed, without importing ray (its settings are read at import)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("ray")
    return bool(spec and spec.submodule_search_locations and
                any((Path(p) / "serve" / "__init__.py").is_file() for p in spec.submodule_search_locations))


def require_ray_serve() -> None:
    """:class:`~vitkit.errors.MissingDependency` naming the ``ray`` extra when Ray Serve is not installed."""
    if not ray_serve_installed():
        from ..errors import MissingDependency
        raise MissingDependency("vitkit serve --ray needs Ray Serve, which is not installed", extra="ray")


class RayBatcher:
    """The :class:`~vitkit.serve.service.Service`'s batcher inside a Ray Serve replica: ``submit`` hands each image
    to the deployment's ``@serve.batch`` method, which coalesces them (same interface as :class:`Batcher`)."""

    def __init__(self, replica: Any, max_batch: int, max_queue: int, max_wait_ms: float):
        self.replica = replica
        self.max_batch, self.max_queue, self.max_wait = max_batch, max_queue, max_wait_ms / 1000.0
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitkit-infer")
        self.pending = 0
        self.dropped = 0
        self.last_compute_s = 0.0
        self._ids = itertools.count(1)

    def start(self) -> None:
        pass

    def expect(self, n: int = 1) -> None:
        """Requests on their way: serve.batch waits its own timeout whatever comes (nothing to do)."""

    async def call(self, fn):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    def submit(self, items) -> List[asyncio.Future]:
        if self.pending + len(items) > self.max_queue:
            retry = max(1, math.ceil((self.pending + len(items)) / self.max_batch * max(self.last_compute_s, 0.01)))
            raise QueueFull(retry, f"the server is busy: {self.pending} images are waiting (at most "
                            f"{self.max_queue}); retry in about {retry} s")
        self.pending += len(items)
        now = time.perf_counter()
        return [asyncio.ensure_future(self.replica.infer((item, now))) for item in items]

    async def run_batch(self, service, jobs) -> List[Done]:
        """The body of the replica's ``@serve.batch`` method: one batch on the inference thread."""
        self.pending -= len(jobs)
        started = time.perf_counter()
        outputs = await asyncio.get_running_loop().run_in_executor(self.executor, service.step,
                                                                   [item for item, _ in jobs])
        took = time.perf_counter() - started
        self.last_compute_s = took
        info = BatchInfo(next(self._ids), len(jobs), took)
        service._on_batch(info)
        return [Done(out, info, started - t) for out, (_, t) in zip(outputs, jobs)]

    async def stop(self) -> None:
        self.executor.shutdown(wait=True)


def make_deployment(max_batch: int = 16, max_wait_ms: float = 5.0, replicas: int = 1,
                    ray_actor_options: Optional[Dict[str, Any]] = None):
    """The Ray Serve deployment class (bind it with ``(weights, options_dict)``)."""
    from ray import serve

    @serve.deployment(name="vitkit", num_replicas=replicas, ray_actor_options=ray_actor_options or {},
                      max_ongoing_requests=max(64, 4 * max_batch))
    @serve.ingress()
    class VitkitServe:
        def __init__(self, weights: Any, options: Dict[str, Any], img_size: Optional[int] = None):
            from .app import load_model
            from .service import Service

            opts = ServeOptions(**options)
            opts.watch_disconnect = False  # Ray's proxy owns the client connection
            self.infer.set_max_batch_size(opts.max_batch)
            self.infer.set_batch_wait_timeout_s(opts.max_wait_ms / 1000.0)
            self.batcher = RayBatcher(self, opts.max_batch, opts.max_queue, opts.max_wait_ms)
            self.service = Service(load_model(weights, img_size=img_size, device=opts.device), opts,
                                   batcher_factory=lambda service: self.batcher)
            # warm up here, on the inference thread: Ray counts a replica as running once this returns, so
            # serve.run (and deploy) return with every replica ready, and a model that cannot be made ready
            # fails the deployment with its error instead of answering 503 for ever
            self.batcher.executor.submit(self.service.prepare).result()

        def __serve_build_asgi_app__(self):
            from .app import build_app

            return build_app(self.service)

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=max_wait_ms / 1000.0)
        async def infer(self, jobs: List[Any]) -> List[Done]:
            return await self.batcher.run_batch(self.service, jobs)

    return VitkitServe


def _init_ray(address: Optional[str], host: str) -> None:
    """Join ``address`` ($RAY_ADDRESS), or start a local Ray instance: on loopback when ``host`` is. Call it
    before anything imports ray (its settings are read at import)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        from .server import is_loopback
        if is_loopback(host):
            # Ray takes the node's routable address even when told 127.0.0.1, except in its single-machine
            # mode (its default on macOS and Windows): its processes then talk over loopback only
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if address:
        ray.init(address=address, ignore_reinit_error=True, logging_level=logging.WARNING)
    else:
        ray.init(include_dashboard=False, ignore_reinit_error=True, logging_level=logging.WARNING)


def deploy(weights: Any, *, host: str = "127.0.0.1", port: int = 8000, options: Optional[ServeOptions] = None,
           replicas: int = 1, address: Optional[str] = None, img_size: Optional[int] = None,
           ray_actor_options: Optional[Dict[str, Any]] = None, name: str = "vitkit"):
    """Start Ray (or join ``address``), Ray Serve's proxy on ``host:port`` and the deployment; returns when
    every replica is ready. ``weights`` must be readable on every node (a shared path, a known name, Hub id or
    URL)."""
    options = options or ServeOptions()
    options.check()
    _init_ray(address, host)
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    cls = make_deployment(options.max_batch, options.max_wait_ms, replicas, ray_actor_options)
    app = cls.bind(weights, asdict(options), img_size)
    return serve.run(app, name=name, route_prefix="/")


def run_ray(weights: Any, *, host: str = "127.0.0.1", port: int = 8000, options: Optional[ServeOptions] = None,
            token_file: Optional[str] = None, insecure: bool = False, replicas: int = 1,
            address: Optional[str] = None, img_size: Optional[int] = None, offline: Optional[bool] = None,
            replica_cpus: Optional[int] = None) -> int:
    """``vitkit serve --ray``: deploy, then wait for SIGTERM / Ctrl+C and shut Ray Serve down (it drains).

    ``replica_cpus``: the CPUs each replica reserves, which Ray also makes its intra-op thread count
    (``OMP_NUM_THREADS``); default: this machine's cores shared among the replicas."""
    require_ray_serve()
    from .server import check_exposure, read_token, setup_logging

    setup_logging("info")
    options = options or ServeOptions()
    token = options.token or read_token(token_file)
    check_exposure(host, token, insecure)
    options.token = token
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    cpus = replica_cpus or max(1, (os.cpu_count() or 1) // replicas)
    deploy(weights, host=host, port=port, options=options, replicas=replicas, address=address, img_size=img_size,
           ray_actor_options={"num_cpus": cpus})
    log.info("serving %s on Ray Serve at http://%s:%d (%d replica(s))", weights, host, port, replicas)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting Ray Serve down (draining)")
    from ray import serve

    serve.shutdown()
    import ray as _ray
    _ray.shutdown()
    return 0
