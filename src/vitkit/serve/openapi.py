"""What /openapi.json says of the image endpoints beyond what FastAPI infers: the request body (one image,
or multipart ``file`` fields), the result rows and the fault answers."""
from __future__ import annotations

from typing import Any, Dict

IMAGE_BODY = {
    "required": True,
    "content": {
        "image/*": {"schema": {"type": "string", "format": "binary"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "array", "items": {"type": "string", "format": "binary"},
                     "description": "one field per image"}}}},
    },
}
_ERROR = {"description": "a client fault", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error", "detail"],
    "properties": {"error": {"type": "string"}, "detail": {"type": "string"}}}}}}
FAULTS = {str(code): dict(_ERROR, description=text) for code, text in (
    (400, "empty body, bad multipart, bad topk"), (401, "missing or wrong token"),
    (408, "the upload stalled"), (409, "the model has no classifier (or no rollout, for /v1/explain)"),
    (413, "too many bytes, pixels or images"),
    (415, "not an image / unsupported Content-Type"), (422, "an image that cannot be decoded"),
    (503, "not ready, or busy (Retry-After)"))}
TOP = {"type": "array", "items": {"type": "object", "properties": {
    "rank": {"type": "integer"}, "index": {"type": "integer"}, "label": {"type": "string"},
    "prob": {"type": "number"}}}}


def result_schema(extra: Dict[str, Any]) -> Dict[str, Any]:
    """The 200 answer of an image endpoint: one row per image, its fields plus ``extra``."""
    row = {"file": {"type": "string"}, "width": {"type": "integer"}, "height": {"type": "integer"},
           "format": {"type": "string"}, "geometry": {"type": "string"},
           "batch": {"type": "object", "properties": {"id": {"type": "integer"}, "size": {"type": "integer"}}},
           **extra}
    return {"description": "one result per image, in the order sent", "content": {"application/json": {"schema": {
        "type": "object", "properties": {
            "model": {"type": "string"}, "engine": {"type": "string"}, "dtype": {"type": "string"},
            "results": {"type": "array", "items": {"type": "object", "properties": row}},
            "timing_ms": {"type": "object", "properties": {k: {"type": "number"} for k in
                                                           ("decode", "queue", "compute", "total")}}}}}}}
