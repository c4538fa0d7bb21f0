"""Reading a request's images within the limits: the body (bytes, stalls, total time), the Content-Type,
the multipart fields and their file names; and the JSON body of an Open Inference Protocol (v2) request."""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import unicodedata
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from .faults import ClientGone, Fault
from .options import ServeOptions


def safe_name(name: Optional[str], i: int) -> str:
    """A file name fit to echo: control characters dropped, undecodable bytes shown as U+FFFD, 200 chars."""
    if not name:
        return f"image {i + 1}"
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if isinstance(name, str) else str(name)
    text = "".join(c for c in text if unicodedata.category(c)[0] != "C")
    return (text or f"image {i + 1}")[:200]


async def read_body(request, limit: int, read_timeout: float, body_timeout: float) -> bytes:
    """The body, at most ``limit`` bytes: a declared Content-Length past it is refused before a byte is read;
    a body that grows past it is refused as soon as it does (the rest is never read). 408 when the upload
    pauses longer than ``read_timeout`` or takes longer than ``body_timeout`` in all."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise Fault(400, "bad_content_length", f"Content-Length {declared[:40]!r} is not a number",
                        close=True) from None
        if n > limit:
            raise Fault(413, "too_large", f"the upload is {n:,} bytes; the limit is {limit:,} (--max-bytes)",
                        close=True)
    buf = bytearray()
    start = time.perf_counter()
    chunks = request.stream().__aiter__()
    while True:
        left = body_timeout - (time.perf_counter() - start)
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(0.0, min(read_timeout, left)))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            what = (f"no data for {read_timeout:g} s" if left > read_timeout else
                    f"not complete after {body_timeout:g} s")
            raise Fault(408, "upload_timeout", f"the upload stalled: {what} ({len(buf):,} bytes received)",
                        close=True) from None
        except ClientDisconnect:
            raise ClientGone() from None
        buf += chunk
        if len(buf) > limit:
            raise Fault(413, "too_large", f"the upload is larger than the limit of {limit:,} bytes (--max-bytes)",
                        close=True)
    return bytes(buf)


async def read_uploads(request, options: ServeOptions) -> List[Tuple[str, bytes]]:
    """The images of a request: the raw body (``image/*`` or ``application/octet-stream``) or the ``file``
    fields of a ``multipart/form-data`` body."""
    ctype = request.headers.get("content-type", "")
    main = ctype.split(";")[0].strip().lower()
    if not (main.startswith("image/") or main in ("application/octet-stream", "multipart/form-data")):
        raise Fault(415, "unsupported_content_type",
                    f"Content-Type {ctype[:80]!r}: send one image as the body (Content-Type image/... or "
                    f"application/octet-stream) or multipart/form-data with a 'file' field per image")
    body = await read_body(request, options.max_bytes, options.read_timeout_s, options.body_timeout_s)
    if main != "multipart/form-data":
        if not body:
            raise Fault(400, "empty_body", "the request has no body: send an image")
        return [("body", body)]
    if not body:
        raise Fault(400, "empty_body", "the multipart body is empty: send a 'file' field per image")
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    request._body = body  # the form parser reads the body we already hold
    try:
        form = await request.form(max_files=options.max_images, max_fields=options.max_images + 16)
    except (HTTPException, MultiPartException) as err:
        detail = getattr(err, "detail", None) or getattr(err, "message", None) or str(err)
        if "Too many files" in detail or "Too many fields" in detail:
            raise Fault(413, "too_many_images", f"more than {options.max_images} images (or fields) in one "
                        f"request (--max-images)") from None
        raise Fault(400, "bad_multipart", f"the multipart body could not be parsed: {detail}") from None
    except (ValueError, KeyError, UnicodeError) as err:
        raise Fault(400, "bad_multipart", f"the multipart body could not be parsed: {err}") from None
    try:
        files = [v for k, v in form.multi_items() if k == "file"]
        if not files:
            names = sorted({k for k, _ in form.multi_items()})
            raise Fault(400, "no_file", "the multipart body has no 'file' field" +
                        (f" (fields: {', '.join(repr(n[:40]) for n in names[:10])})" if names else ""))
        uploads = []
        for i, f in enumerate(files):
            if isinstance(f, str):
                raise Fault(400, "bad_multipart", f"field 'file' number {i + 1} is text, not a file upload")
            uploads.append((safe_name(f.filename, i), await f.read()))
        return uploads
    finally:
        await form.close()


async def wait_disconnect(request) -> None:
    """Returns when the client has gone (the body has been read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


# --- the Open Inference Protocol (v2) -------------------------------------------------------------------
V2_OUTPUTS = ("logits", "probabilities", "features")


@dataclass
class V2Request:
    """One ``/v2/models/{id}/infer`` request, checked: either ``uploads`` (a BYTES input: encoded images) or
    ``pixels`` (an FP32 input: the model's input [N, C, H, W], already preprocessed), and the outputs asked
    for (empty: the defaults)."""

    id: Optional[str]
    input_name: str
    uploads: List[Tuple[str, bytes]]
    pixels: Optional[np.ndarray]
    outputs: List[str]


async def read_v2_request(request, options: ServeOptions, chw: Tuple[int, int, int]) -> V2Request:
    """The body of a v2 infer request (JSON), read within the same limits as an upload, then parsed on a
    worker thread (a large tensor's JSON takes a while)."""
    if request.headers.get("inference-header-content-length") is not None:
        raise Fault(400, "binary_data_unsupported", "the binary tensor data extension is not supported: send the "
                    "tensor as JSON 'data' (tritonclient: binary_data=False)")
    ctype = request.headers.get("content-type", "")
    if ctype and ctype.split(";")[0].strip().lower() != "application/json":
        raise Fault(415, "unsupported_content_type", f"Content-Type {ctype[:80]!r}: a v2 inference request is "
                    f"JSON (application/json)")
    body = await read_body(request, options.max_bytes, options.read_timeout_s, options.body_timeout_s)
    return await asyncio.get_running_loop().run_in_executor(None, parse_v2_request, body, options.max_images, chw)


def parse_v2_request(body: bytes, max_images: int, chw: Tuple[int, int, int]) -> V2Request:
    """A v2 inference request's JSON body -> :class:`V2Request`, or a 4xx :class:`Fault` naming the problem."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise Fault(400, "bad_json", f"the body is not JSON: {err}") from None
    inputs = req.get("inputs") if isinstance(req, dict) else None
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise Fault(400, "bad_inputs", "send one input in 'inputs': FP32 'pixels' [N, C, H, W] (preprocessed) or "
                    "BYTES 'images' [N] (encoded images, base64)")
    inp = inputs[0]
    name, dtype, shape, data = inp.get("name"), inp.get("datatype"), inp.get("shape"), inp.get("data")
    if not isinstance(name, str) or not isinstance(data, list):
        raise Fault(400, "bad_inputs", "the input needs a 'name' and its 'data' (a list)")
    if not (isinstance(shape, list) and shape and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1
                                                      for d in shape)):
        raise Fault(400, "bad_shape", f"input {name[:40]!r}: 'shape' must be a list of positive integers, "
                    f"got {str(shape)[:80]}")
    if shape[0] > max_images:
        raise Fault(413, "too_many_images", f"{shape[0]} images in one request; the limit is {max_images} "
                    f"(--max-images)")
    outputs = _v2_outputs(req.get("outputs"))
    if dtype == "FP32":
        return V2Request(_request_id(req), name, [], _v2_pixels(name, shape, data, chw), outputs)
    if dtype == "BYTES":
        return V2Request(_request_id(req), name, _v2_images(name, shape, data), None, outputs)
    raise Fault(400, "bad_datatype", f"input {name[:40]!r} is {str(dtype)[:20]}: send FP32 (the preprocessed "
                f"pixels [N, {chw[0]}, {chw[1]}, {chw[2]}]) or BYTES (encoded images, base64)")


def _request_id(req: dict) -> Optional[str]:
    rid = req.get("id")
    return None if rid is None else str(rid)[:200]


def _v2_outputs(outputs) -> List[str]:
    if outputs is None:
        return []
    names = [o.get("name") if isinstance(o, dict) else None for o in outputs] if isinstance(outputs, list) else [None]
    bad = [str(n)[:40] for n in names if n not in V2_OUTPUTS]
    if bad:
        raise Fault(400, "bad_output", f"unknown output {bad[0]!r}: ask for {', '.join(V2_OUTPUTS)}")
    return list(dict.fromkeys(names))


def _v2_pixels(name: str, shape: List[int], data: list, chw: Tuple[int, int, int]) -> np.ndarray:
    """The FP32 input as [N, C, H, W] float32 (``data`` flat row-major, or nested as the shape)."""
    if len(shape) != 4 or tuple(shape[1:]) != tuple(chw):
        raise Fault(400, "bad_shape", f"input {name[:40]!r} has shape {shape}; this model takes [N, {chw[0]}, "
                    f"{chw[1]}, {chw[2]}] (NCHW, preprocessed as GET /v2/models/ID and /v1/model say)")
    try:
        x = np.asarray(data, dtype=np.float32)
    except (ValueError, TypeError):
        raise Fault(400, "bad_data", f"input {name[:40]!r}: 'data' must hold numbers only (flat row-major, or "
                    f"nested as the shape)") from None
    if x.size != int(np.prod(shape)):
        raise Fault(400, "bad_shape", f"input {name[:40]!r}: {x.size:,} values for shape {shape}, which needs "
                    f"{int(np.prod(shape)):,}")
    if not np.isfinite(x).all():
        raise Fault(400, "not_finite", f"input {name[:40]!r} holds NaN or infinite values")
    return x.reshape(shape)


def _v2_images(name: str, shape: List[int], data: list) -> List[Tuple[str, bytes]]:
    """The BYTES input's images (each element base64, as the protocol carries bytes in JSON)."""
    if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)) or len(data) != shape[0]:
        raise Fault(400, "bad_shape", f"input {name[:40]!r}: BYTES images have shape [N] (or [N, 1]) with N "
                    f"elements in 'data'; got shape {shape} and {len(data)} elements")
    out = []
    for i, item in enumerate(data):
        item = item[0] if isinstance(item, list) and len(item) == 1 else item
        if not isinstance(item, str):
            raise Fault(400, "bad_data", f"input {name[:40]!r}, element {i}: a base64 string, got "
                        f"{type(item).__name__}")
        try:
            out.append((f"{name[:40]}[{i}]", base64.b64decode(item, validate=True)))
        except (binascii.Error, ValueError) as err:
            raise Fault(400, "bad_base64", f"input {name[:40]!r}, element {i} is not base64: {err}") from None
    return out
