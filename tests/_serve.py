"""Helpers of the serve tests: a tiny checkpoint, photos, and a real uvicorn server on a free loopback port."""
from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from typing import Iterator, Optional

import numpy as np
import torch
from PIL import Image

import vitkit
from _weights import randomize
from vitkit.checkpoints import save_model
from vitkit.data.preprocess import get_preset

LABELS = ["tabby", "espresso", "teapot", "tench", "kite"]


def tiny_model(num_classes: int = len(LABELS), seed: int = 0, img_size: int = 32):
    """A small random ViT at 32 px (2 blocks) whose logits vary with the image (at 224 px: 16 px patches)."""
    torch.manual_seed(seed)
    model = vitkit.create_model("Ti/16", img_size=img_size, patch_size=8 if img_size < 224 else 16, depth=2,
                                num_classes=num_classes, width=64, num_heads=2, mlp_dim=128)
    randomize(model, std=0.2)
    return model.eval()


def tiny_checkpoint(folder, num_classes: int = len(LABELS), img_size: int = 32):
    model = tiny_model(num_classes, img_size=img_size)
    return save_model(model, folder, labels=LABELS[:num_classes] if num_classes else None,
                      preprocessing=get_preset("torchvision", img_size))


def image_bytes(fmt: str = "PNG", size=(80, 60), seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """A real uvicorn server (HTTP on 127.0.0.1) running ``app`` in a thread of this process."""

    def __init__(self, app, port: Optional[int] = None):
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 60.0, ready: str = "/readyz") -> "ServerThread":
        import httpx

        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + ready, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if not self.thread.is_alive():
                raise RuntimeError("the server thread ended")
            time.sleep(0.05)
        raise TimeoutError("the server did not get ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@contextlib.contextmanager
def serving(app, ready: str = "/readyz") -> Iterator[ServerThread]:
    srv = ServerThread(app).start(ready=ready)
    try:
        yield srv
    finally:
        srv.stop()


def raw_request(port: int, head: bytes, body: bytes = b"", *, wait: float = 10.0) -> bytes:
    """Send bytes over a fresh socket; return everything the server answers until it closes (or ``wait``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head + body)
        return read_all(s, wait)


def read_all(s: socket.socket, wait: float = 10.0) -> bytes:
    s.settimeout(wait)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out:  # a whole response, by its Content-Length
                head, _, rest = out.partition(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and len(rest) >= int(line.split(b":")[1]):
                        return out
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
