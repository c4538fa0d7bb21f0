"""Reading a request's images within the limits: the body (bytes, stalls, total time), the Content-Type,
the multipart fields and their file names."""
from __future__ import annotations

import asyncio
import time
import unicodedata
from typing import List, Optional, Tuple

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
