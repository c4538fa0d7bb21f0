"""The Prometheus metrics of one app: requests, latency, batches, faults, the queue, readiness."""
from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

if TYPE_CHECKING:
    from .service import Service


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
