"""How ``vitkit serve`` runs: :class:`ServeOptions` (engine, batching, limits), checked before anything starts."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

import torch

from ..errors import ConfigError


@dataclass
class ServeOptions:
    """How the service runs: engine, batching, limits. Every field has a ``vitkit serve`` flag
    (:data:`vitkit.cli.serve.OPTION_FLAGS`); the token's is ``--token-file`` (or ``$VITKIT_SERVE_TOKEN``)."""

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
    device: str = "cpu"  # where the model runs (the torch engine: cpu, cuda, cuda:1, mps; the others: cpu)
    decode_threads: int = 2
    watch_disconnect: bool = True  # drop the images of a request whose client has gone

    def check(self) -> "ServeOptions":
        from .engines import DTYPES, ENGINES

        if self.engine not in ("auto", *ENGINES):
            raise ConfigError(f"unknown engine {self.engine!r}: use auto, {', '.join(ENGINES)}", key="engine")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}: use {', '.join(DTYPES)}", key="dtype")
        for name in ("max_batch", "max_queue", "max_bytes", "max_pixels", "max_images", "max_topk", "decode_threads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"must be at least 1, got {getattr(self, name)}", key=name)
        for name in ("max_wait_ms", "read_timeout_s", "body_timeout_s", "engine_budget_s"):
            if float(getattr(self, name)) < 0:
                raise ConfigError(f"must not be negative, got {getattr(self, name)}", key=name)
        try:
            dev = torch.device(self.device)
        except RuntimeError as err:
            raise ConfigError(f"{self.device!r} is not a device ({err}): use cpu, cuda, cuda:1, mps",
                              key="device") from None
        if (dev.type == "cuda" and not torch.cuda.is_available()) or (
                dev.type == "mps" and not torch.backends.mps.is_available()):
            raise ConfigError(f"{self.device} is not available on this machine", key="device")
        if self.token is not None and not self.token.strip():
            raise ConfigError("the token is empty", key="token")
        return self

    def public(self) -> Dict[str, Any]:
        d = asdict(self)
        d.pop("token")
        d["token_required"] = self.token is not None
        return d
