"""A client for ``vitkit serve`` (standard library only): ``Client(url, token=None).classify(paths)``."""
from __future__ import annotations

import json
import mimetypes
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import UsageError, VitkitError

PathLike = Union[str, Path]


class ServeClientError(VitkitError, RuntimeError):
    """The server refused a request (``status``, ``error``, ``detail`` from its JSON body) or could not be
    reached (``status`` 0)."""

    def __init__(self, status: int, error: str, detail: str):
        super().__init__(f"{detail} (HTTP {status} {error})" if status else detail)
        self.status, self.error, self.detail = status, error, detail

    def __reduce__(self):
        return (type(self), (self.status, self.error, self.detail))


class Client:
    """Talk to a ``vitkit serve`` server at ``url`` (``http://127.0.0.1:8000``), with a bearer ``token`` when
    it needs one. Images go ``per_request`` to a request (multipart, one ``file`` field each)."""

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 60.0, per_request: int = 16):
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--url {url!r}: give the server's address, e.g. http://127.0.0.1:8000")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.per_request = max(1, int(per_request))

    # --- the API ---------------------------------------------------------------------------------------------
    def model(self) -> Dict[str, Any]:
        return self._request("GET", "/v1/model")

    def ready(self) -> bool:
        try:
            self._request("GET", "/readyz")
            return True
        except ServeClientError:
            return False

    def classify(self, images: Sequence[Union[PathLike, bytes]], topk: int = 5) -> List[Dict[str, Any]]:
        """One result per image, in order: ``{"file", "top": [{"rank", "index", "label", "prob"}], ...}``."""
        return self._many("/v1/classify", images, {"topk": topk})

    def embed(self, images: Sequence[Union[PathLike, bytes]]) -> List[Dict[str, Any]]:
        """One result per image: ``{"file", "dim", "embedding": [floats]}``."""
        return self._many("/v1/embed", images, {})

    def explain(self, images: Sequence[Union[PathLike, bytes]], topk: int = 5) -> List[Dict[str, Any]]:
        """Top-k plus ``overlay_png`` (base64 PNG of the attention-rollout overlay) per image."""
        return self._many("/v1/explain", images, {"topk": topk})

    # --- plumbing --------------------------------------------------------------------------------------------
    def _many(self, path: str, images, params) -> List[Dict[str, Any]]:
        if isinstance(images, (str, Path, bytes)):
            images = [images]
        out: List[Dict[str, Any]] = []
        for start in range(0, len(images), self.per_request):
            parts = [_part(item, start + i) for i, item in enumerate(images[start:start + self.per_request])]
            body, ctype = _multipart(parts)
            out.extend(self._request("POST", path, params, body, ctype)["results"])
        return out

    def _request(self, method: str, path: str, params: Optional[Dict[str, Any]] = None, body: Optional[bytes] = None,
                 ctype: Optional[str] = None) -> Dict[str, Any]:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        req = urllib.request.Request(url, data=body, method=method)
        if ctype:
            req.add_header("Content-Type", ctype)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the user's server
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                data = json.loads(raw.decode("utf-8"))
                raise ServeClientError(err.code, data.get("error", "?"), data.get("detail", "")) from None
            except (ValueError, AttributeError):
                raise ServeClientError(err.code, "http_error", raw[:200].decode("utf-8", "replace")) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise ServeClientError(0, "unreachable", f"cannot reach {self.url}: {reason}") from None


def _part(item: Union[PathLike, bytes], i: int) -> Tuple[str, bytes]:
    if isinstance(item, (bytes, bytearray)):
        return f"image{i + 1}", bytes(item)
    path = Path(item)
    return path.name, path.read_bytes()


def _multipart(parts: Sequence[Tuple[str, bytes]]) -> Tuple[bytes, str]:
    boundary = "vitkit-" + uuid.uuid4().hex
    chunks: List[bytes] = []
    for name, data in parts:
        safe = name.replace("\\", "_").replace('"', "_").replace("\r", "_").replace("\n", "_")
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        chunks.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe}"\r\n'
                      f"Content-Type: {ctype}\r\n\r\n".encode("utf-8", "surrogateescape"))
        chunks.append(data)
        chunks.append(b"\r\n")
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"
