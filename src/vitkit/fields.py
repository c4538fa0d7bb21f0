"""Typed fields: the type of every config and recipe key comes from its dataclass annotation.

:func:`coerce_field` checks a value (from a JSON file, a ``--set key=value`` override or a keyword
argument) against the annotation of a dataclass field and returns it in that type, or raises
ConfigError naming the key, the value and the type expected.
"""
from __future__ import annotations

import functools
import numbers
import typing
from typing import Any, Dict, Optional

from .errors import ConfigError


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> Dict[str, Any]:
    """The resolved type annotation of each field of the dataclass ``cls``."""
    return typing.get_type_hints(cls)


class _Mismatch(Exception):
    pass


def coerce_field(cls: type, name: str, value: Any, key: Optional[str] = None, *, scalar_pairs: bool = False) -> Any:
    """``value`` checked against the annotation of field ``name`` of the dataclass ``cls`` and returned in
    that type (an int where a float is expected becomes a float, a list where a tuple is expected a
    tuple). A mismatch raises ConfigError naming the key, the value and the expected type."""
    tp = field_types(cls)[name]
    try:
        return _coerce(value, tp, scalar_pairs)
    except _Mismatch:
        raise ConfigError(f"got {value!r}, expected {describe_type(tp, scalar_pairs)}", key=key or name,
                          hint=f"e.g. {key or name}={_example(tp)}") from None


def _coerce(value: Any, tp: Any, scalar_pairs: bool = False) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return _coerce(value, a, scalar_pairs)
                except _Mismatch:
                    pass
        raise _Mismatch
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        raise _Mismatch
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        if value is None:  # a field that is always a string: `--set augment.crop=none` means the word
            return "none"
        if isinstance(value, numbers.Real) and not isinstance(value, bool):  # --set data.dataset=123
            return str(value)
        raise _Mismatch
    if origin in (tuple, list):
        if scalar_pairs and not isinstance(value, (list, tuple)) and args and args[-1] is not Ellipsis:
            item = _coerce(value, args[0])
            return tuple(item for _ in args)
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_coerce(v, a) for v, a in zip(value, args))
        items = [_coerce(v, args[0]) for v in value] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return value
        raise _Mismatch
    return value  # an annotation we do not check


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def describe_type(tp: Any, scalar_pairs: bool = False) -> str:
    """An annotation in words: 'an integer', 'a number or null', 'a list of 2 numbers' ..."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        parts = [describe_type(a, scalar_pairs) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in args else "")
    if origin in (tuple, list):
        if not args:
            return "a list"
        if origin is tuple and args[-1] is not Ellipsis:
            plural = describe_type(args[0]).split(" ", 1)[-1] + "s"
            text = f"a list of {len(args)} {plural}"
            return f"{describe_type(args[0])} or {text}" if scalar_pairs else text
        return f"a list of {describe_type(args[0]).split(' ', 1)[-1]}s"
    if origin is dict or tp is dict:
        return "a mapping"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _example(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return _example(next(a for a in args if a is not type(None)))
    if origin in (tuple, list):
        n = len(args) if origin is tuple and args and args[-1] is not Ellipsis else 2
        return "[" + ",".join([_example(args[0]) if args else "1"] * n) + "]"
    return {bool: "true", int: "8", float: "0.5", str: "NAME"}.get(tp, "...")
